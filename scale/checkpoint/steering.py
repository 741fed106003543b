"""Deliberate changes at resume: roll back to a chosen sealed checkpoint (train.resume_step) and reset parts of the
saved state (train.reset). Each applies once: checkpoints/steering.json records what was applied, so that a requeued
job launched with the same recipe continues from its newest checkpoint instead of rolling back again."""

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from scale.errors import UserError
from scale.nofollow import write_atomic
from scale.readback import STEERING, BadFile, read_json

log = logging.getLogger(__name__)

# optimizer: fresh moments (and loss scale); data: the loader's position and counters from 0; schedules: the step
# count from 0 (warm-up, lr, momentum, temperatures start over); ema: the teacher restarts as a copy of the student
RESETS = ("optimizer", "data", "schedules", "ema")
RECORD = "steering.json"


@dataclass(frozen=True)
class Steering:
    step: int | None = None  # the checkpoint to load; None: the newest loadable one
    reset: tuple[str, ...] = ()

    def wants(self) -> dict:
        return {"resume_step": self.step, "reset": sorted(self.reset)}


def pending(train_cfg, root: Path) -> Steering:
    """What the recipe asks for and has not been applied to this run yet."""
    asked = Steering(train_cfg.get("resume_step"), tuple(train_cfg.get("reset") or ()))
    if asked == Steering():
        return asked
    path = Path(root) / RECORD
    try:
        done = read_json(path, STEERING) if path.is_file() else {}
    except BadFile as err:
        raise UserError(
            f"{err}; it records the train.resume_step/train.reset this run has applied: delete it to apply "
            "them again, or take them out of the recipe"
        ) from None
    if done.get("applied") == asked.wants():
        log.info(
            "train.resume_step/train.reset %s were applied on %s (%s): continuing from the newest checkpoint",
            asked.wants(),
            done.get("at"),
            path,
        )
        return Steering()
    return asked


def record(root: Path, steering: Steering, loaded_step: int, set_aside: Path | None) -> None:
    entry = {
        "applied": steering.wants(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loaded_step": loaded_step,
        "set_aside": str(set_aside) if set_aside else None,
    }
    write_atomic(Path(root) / RECORD, json.dumps(entry, indent=2) + "\n")
