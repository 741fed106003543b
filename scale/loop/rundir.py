"""The run directory: config.yaml, metrics.jsonl, TensorBoard events, checkpoints/, logs/ (one log per rank)."""

import json
import logging
import os
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from scale.errors import ConfigError
from scale.nofollow import open_fd, open_text, refuse_links, write_atomic
from scale.readback import RUN_CONFIG, BadFile, read_yaml

LOG_FORMAT = "%(asctime)s [rank %(rank)d] %(levelname)s %(name)s: %(message)s"


class RunDir:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    config = property(lambda self: self.root / "config.yaml")
    metrics = property(lambda self: self.root / "metrics.jsonl")
    tensorboard = property(lambda self: self.root / "tensorboard")
    checkpoints = property(lambda self: self.root / "checkpoints")
    logs = property(lambda self: self.root / "logs")

    def create(self) -> "RunDir":
        for folder in (self.root, self.checkpoints, self.logs, self.tensorboard):
            folder.mkdir(parents=True, exist_ok=True)
        return self

    def written_in_place(self) -> list[Path]:
        """The files scale opens in this run directory to write into (the lock, appended logs). The ones it rewrites
        (config.yaml, checkpoints/latest, trackers.json...) replace whatever stands at their name, a link included,
        and a linked folder (checkpoints/ on another file system) is the user's own choice."""
        from scale.loop.runlock import LOCK_FILE

        ranks = sorted(self.logs.glob("rank*.log")) if self.logs.is_dir() else []
        return [self.root / LOCK_FILE, self.metrics, self.checkpoints / "saves.jsonl", *ranks]

    def check_writable(self) -> None:
        """Refuse links where scale writes (scale.nofollow), create the folders and write a probe file, so that a
        run directory that cannot be written fails with one message before any process is spawned."""
        refuse_links(self.written_in_place())
        try:
            self.create()
            probe = self.root / f".write-probe-{os.getpid()}"
            os.close(open_fd(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
            probe.unlink()
        except OSError as err:
            raise ConfigError(f"run directory {self.root}: cannot write there ({err.strerror or err})") from None

    def read_config(self) -> dict:
        """The saved recipe (config.yaml) as a dict; a damaged one is a ConfigError that says what to do."""
        fix = (
            "it is this run's resolved recipe, written at each start: restore it from a copy, or delete it to "
            "continue with the recipe as given (without the check that it matches the checkpoints), or use a new "
            "--run-dir"
        )
        try:
            return read_yaml(self.config, RUN_CONFIG)
        except BadFile as err:
            raise ConfigError(f"{err}; {fix}") from None
        except OSError as err:
            raise ConfigError(f"{self.config}: cannot read it ({err.strerror or err}); {fix}") from None

    def write_config(self, cfg: DictConfig) -> None:
        write_atomic(self.config, OmegaConf.to_yaml(cfg))


class _RankFilter(logging.Filter):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def setup_logging(run_dir: RunDir | None, rank: int, level: int = logging.INFO) -> None:
    """Rank 0 prints progress; every rank prints its warnings and errors with its rank, and logs everything to
    logs/rank{N}.log."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(level)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(level if rank == 0 else logging.WARNING)
    console.setFormatter(logging.Formatter(LOG_FORMAT, "%H:%M:%S"))
    handlers: list[logging.Handler] = [console]
    if run_dir is not None:
        run_dir.logs.mkdir(parents=True, exist_ok=True)
        file = _LogFile(run_dir.logs / f"rank{rank}.log")
        file.setFormatter(logging.Formatter(LOG_FORMAT))
        handlers.append(file)
    for handler in handlers:
        handler.addFilter(_RankFilter(rank))
        root.addHandler(handler)


class _LogFile(logging.FileHandler):
    """A rank's log file, never appended through a link (scale.nofollow)."""

    def _open(self):
        return open_text(self.baseFilename, "a")


def write_json(path: str | Path, result: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(result, indent=2, default=_json_default) + "\n")
    return path


def _json_default(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
