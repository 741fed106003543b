"""The recipe's `train.tracker` section: where the experiment trackers of `train.trackers` put the run."""

from dataclasses import dataclass, field


@dataclass
class TrackerConfig:
    project: str = ""  # W&B project, MLflow experiment; "": meta.paper, else "scale"
    name: str = ""  # the run's display name; "": meta.name
    # tags of the tracker run
    tags: list[str] = field(default_factory=list)
    entity: str = ""  # W&B team or user; "": the logged-in default
    # MLflow tracking server or store; "": a file store in <run>/mlruns (no server, no network)
    tracking_uri: str = ""
    offline: bool = False  # W&B writes to <run>/wandb only (as WANDB_MODE=offline); `wandb sync` uploads it later
