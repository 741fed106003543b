"""Libraries that only an optional part of scale needs come from an extra (setup.cfg: eval, viz, trackers, deepspeed,
dali): imported here, when that part runs, so that a core install runs everything else and a missing extra is one
clear message (a UserError: exit 2) naming the `pip install` that adds it."""

import importlib
import importlib.util
from types import ModuleType

from scale.errors import UserError


class MissingExtra(UserError):
    pass


def require(extra: str, module: str, purpose: str = "") -> ModuleType:
    """`import module`, or a MissingExtra naming `pip install 'scale[extra]'`. `purpose` says what needs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        needs = f"{purpose} needs" if purpose else "this needs"
        raise MissingExtra(
            f"{needs} {module}, from scale's '{extra}' extra, which is not importable here ({err}); "
            f"install it with: pip install 'scale[{extra}]'"
        ) from None


def available(module: str) -> bool:
    """Whether `module` is installed, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a submodule whose parent package is missing
        return False


def import_timm() -> ModuleType:
    """`import timm` without the wandb that timm imports for its own training script (timm.utils.summary tries
    `import wandb`: 2-3 CPU seconds per process, paid by every rank of a run that tracks nothing). wandb is hidden
    only while timm imports, so a run with train.trackers=[wandb] imports it as usual (scale.trackers)."""
    import sys

    if "timm" in sys.modules or "wandb" in sys.modules:
        return importlib.import_module("timm")
    sys.modules["wandb"] = None  # type: ignore[assignment]  # `import wandb` raises ImportError, which timm catches
    try:
        return importlib.import_module("timm")
    finally:
        del sys.modules["wandb"]
