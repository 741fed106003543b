"""What every experiment tracker implements (scale.trackers.Trackers fans a run's records out to them)."""

import os
from pathlib import Path


class Sink:
    """A tracker's run. Built with the recipe's `train.tracker` settings, the run directory, the id of the run a
    previous attempt of this run created (None: create one) and the run's config (recipe, sources, git commit)."""

    package = ""  # what is imported: a missing one is a ConfigError naming the `trackers` extra
    run_id: str | None = None  # saved in <run>/trackers.json and passed back on resume
    # the last step the tracker's own files hold of its run, read back on opening (None: trusted to hold every
    # step trackers.json says was sent); fewer: the missing steps are sent again from metrics.jsonl
    held_step: int | None = None

    @staticmethod
    def new_id() -> str | None:
        """A run id chosen before the run is created (None: the tracker assigns it when creating the run)."""
        return None

    @staticmethod
    def stores(settings, root: Path) -> list[Path]:
        """The local folders the tracker writes with these settings (none: a server), checked writable before the
        ranks start (scale.trackers.check_stores)."""
        return []

    def log(self, step: int, scalars: dict[str, float]) -> None:
        raise NotImplementedError

    def attach(self, paths: list[Path]) -> None:
        """Files or folders made after training (report, exported weights)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def files_of(paths: list[Path]) -> list[Path]:
    """The files of `paths`, folders expanded."""
    return [f for p in paths for f in (sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p])]


def setting(recipe_value, env: str, default):
    """A tracker setting: the recipe's key when set, else the environment variable the tracker's own library
    defines (a cluster profile's MLFLOW_TRACKING_URI, WANDB_DIR, ...), else scale's default."""
    return recipe_value or os.environ.get(env) or default
