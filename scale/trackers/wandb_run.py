"""Weights & Biases: one W&B run per scale run, resumed by id after a requeue. Offline (`train.tracker.offline`
or WANDB_MODE=offline) it writes <run>/wandb/offline-run-*, one folder per attempt with the same run id, which
`wandb sync` uploads into that one run. Project, entity and mode: the recipe's keys, else WANDB_PROJECT,
WANDB_ENTITY and WANDB_MODE, else meta.paper, the logged-in default and online; the files go to WANDB_DIR, else the
run directory."""

from pathlib import Path

from scale.trackers.sink import Sink, setting


class WandbSink(Sink):
    package = "wandb"

    def __init__(self, settings, root: Path, run_id: str | None, config: dict):
        import wandb

        self.run = wandb.init(
            project=setting(settings.project, "WANDB_PROJECT", settings.default_project),
            entity=setting(settings.entity, "WANDB_ENTITY", None),
            name=settings.name,
            tags=list(settings.tags) or None,
            id=run_id,
            resume="allow",
            dir=str(WandbSink.stores(settings, root)[0]),
            config=config,
            mode="offline" if settings.offline else setting(None, "WANDB_MODE", None),  # None: online
            settings=wandb.Settings(console="off"),  # our own logs are in <run>/logs
        )
        self.run_id = self.run.id

    @staticmethod
    def stores(settings, root: Path) -> list[Path]:
        return [Path(setting(None, "WANDB_DIR", str(root)))]  # W&B writes <dir>/wandb, online or offline

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
