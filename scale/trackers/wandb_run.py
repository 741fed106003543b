"""Weights & Biases: one W&B run per scale run, resumed by id after a requeue. Offline (`train.tracker.offline`
or WANDB_MODE=offline) it writes <run>/wandb/offline-run-*, one folder per attempt with the same run id, which
`wandb sync` uploads into that one run."""

from pathlib import Path

from scale.trackers.sink import Sink


class WandbSink(Sink):
    package = "wandb"

    def __init__(self, settings, root: Path, run_id: str | None, config: dict):
        import wandb

        self.run = wandb.init(
            project=settings.project,
            entity=settings.entity or None,
            name=settings.name,
            tags=list(settings.tags) or None,
            id=run_id,
            resume="allow",
            dir=str(root),
            config=config,
            mode="offline" if settings.offline else None,  # None: WANDB_MODE, else online
            settings=wandb.Settings(console="off"),  # our own logs are in <run>/logs
        )
        self.run_id = self.run.id

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def attach(self, paths: list[Path]) -> None:
        import wandb

        artifact = wandb.Artifact(f"{self.run.id}-outputs", type="run-outputs")
        for path in paths:
            if path.is_dir():
                artifact.add_dir(str(path), name=path.name)
            else:
                artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def close(self) -> None:
        self.run.finish()
