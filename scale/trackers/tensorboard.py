"""TensorBoard: scalars under <run>/tensorboard; the PNGs of the attached artifacts as images."""

from pathlib import Path

from scale.trackers.sink import Sink, files_of


class TensorBoardSink(Sink):
    package = "tensorboard"

    def __init__(self, settings, root: Path, run_id: str | None, config: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(self.stores(settings, root)[0]))
        self.run_id = None  # the folder is the run

    @staticmethod
    def stores(settings, root: Path) -> list[Path]:
        return [root / "tensorboard"]

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)

    def attach(self, paths: list[Path]) -> None:
        import numpy as np
        from PIL import Image

        for png in (p for p in files_of(paths) if p.suffix == ".png"):
            with Image.open(png) as image:
                self.writer.add_image(f"artifacts/{png.stem}", np.asarray(image.convert("RGB")), dataformats="HWC")

    def close(self) -> None:
        self.writer.close()
