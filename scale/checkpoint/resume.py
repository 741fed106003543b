"""Resuming a run, top to bottom in this module:

1. `read_start` (once per launch, before any rank starts): whether the run directory can continue with this recipe,
   as each schema field declares it (scale/config/fields.py): a FIXED field (a checkpointed shape, the trained
   parameters, what the saved position means) is refused, a NOTED one is logged, any other changes freely.
2. `Resumable.resume` (every rank, the checkpointer's): the checkpoints to try, newest first, or the one
   train.resume_step names (scale.checkpoint.steering); each rank reads its share of a checkpoint's files as data
   (scale.checkpoint.safe_load), the ranks agree, and all load the same one (`load`): the engine's state through DCP
   or its own files, then every state object (scale.checkpoint.state), all rolled back when a load fails half-way;
   then train.reset's parts and the checkpoints newer than the loaded one are set aside.
"""

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from omegaconf import DictConfig, OmegaConf
from torch.distributed.checkpoint.api import CheckpointException

from scale.checkpoint.fit import check_deepspeed_fits, check_fits
from scale.checkpoint.safe_load import SafeLoadPlanner, SafeReader, UnsafeCheckpoint, check_files, load_torch
from scale.checkpoint.state import RESET_STATES, load_engine_files, load_states, rolled_back
from scale.checkpoint.steering import Steering, pending, record
from scale.checkpoint.store import CheckpointStore, step_of
from scale.config.fields import FIXED, NOTED
from scale.config.load import from_dict
from scale.config.schema import Recipe
from scale.config.validate import get_key, schema_rules
from scale.errors import ConfigError, UserError

log = logging.getLogger(__name__)

# what a rank found when it read its share of a checkpoint's files; the ranks agree on the worst
READABLE, DAMAGED, UNSAFE = 0, 1, 2


@dataclass(frozen=True)
class Start:
    """What start-up reads of the run directory, once per process: the changes to an existing run's settings that
    check_resumable allowed and the log names (fields NOTED on resume), and whether no checkpoint is sealed yet
    (a fresh run loads train.init_weights)."""

    notes: list[str]
    fresh: bool


def read_start(run, cfg: DictConfig) -> Start:
    """`run`: the run directory (scale.loop.rundir.RunDir). Raises ConfigError when it cannot continue with this
    recipe."""
    return Start(check_resumable(run, cfg), not CheckpointStore(run.checkpoints).candidates())


def keys_with(resume: str) -> list[str]:
    """The dotted keys whose schema rule is `resume` (FIXED or NOTED)."""
    return [dotted for dotted, rule in schema_rules(Recipe) if rule.get("resume") == resume]


def _changes(saved: DictConfig, new: DictConfig, keys: list[str]) -> list[str]:
    def plain(value):
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value

    found = []
    for key in keys:
        old, value = plain(get_key(saved, key)), plain(get_key(new, key))
        if old != value:
            found.append(f"{key}: {old!r} -> {value!r}")
    return found


def check_compatible(saved: DictConfig, new: DictConfig, where: str) -> list[str]:
    """Fail naming every FIXED key that differs between the saved config and the new one; the NOTED changes, for
    the resumed run to log."""
    fixed = _changes(saved, new, keys_with(FIXED))
    if fixed:
        raise ConfigError(
            f"{where} cannot be resumed with this recipe; these settings are fixed on resume and changed: "
            + "; ".join(fixed)
            + ". Restore them, or start a new run (another --run-dir, train.init_weights for its weights)."
        )
    return _changes(saved, new, keys_with(NOTED))


def check_resumable(run, cfg: DictConfig) -> list[str]:
    """A run directory with a checkpoint continues only with a compatible recipe (the changes it allowed but
    notes are returned); one without (a start that failed before its first checkpoint) takes any recipe."""
    if run.config.exists() and CheckpointStore(run.checkpoints).step_dirs():
        saved = from_dict(run.read_config(), str(run.config))
        return check_compatible(saved, cfg, str(run.root))
    return []


class Resumable:
    """The resume half of the Checkpointer (scale.checkpoint.checkpointer), and the collectives both halves use:
    the ranks of the data-parallel group load together."""

    def _barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier(group=self.group)

    def _broadcast(self, value):
        if not dist.is_initialized():
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def _worst(self, value: int) -> int:
        """The largest of every rank's `value`."""
        if not dist.is_initialized():
            return value
        flag = torch.tensor([value], dtype=torch.int32)
        if dist.get_backend(self.group) == "nccl":
            flag = flag.cuda()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return int(flag.item())

    def resume(self) -> int:
        """Load the newest checkpoint that every rank can load (skipping damaged ones with a warning naming the
        file), or the one train.resume_step names; the step to continue from. Every rank first reads its share of
        the files as data, then the ranks agree, so that they all load the same checkpoint. A file that would run
        code, or a checkpoint that does not fit this run's shapes, ends the run (exit 2) with nothing deleted.
        Checkpoints newer than the one loaded are moved to checkpoints/set_aside/, out of retention's reach."""
        plan = self._broadcast(self._plan() if self.info.is_main else None)
        if "error" in plan:
            self._fail(plan["error"])
        steering = Steering(plan["step"], tuple(plan["reset"]))
        for folder in map(Path, plan["folders"]):
            verdict, problem = self._check(folder)
            worst = self._worst(verdict)
            if worst == UNSAFE:
                if isinstance(problem, UnsafeCheckpoint):
                    raise problem
                raise SystemExit(UnsafeCheckpoint.exit_code)  # the rank that found it says why, once
            if worst == READABLE:
                try:
                    step = self.load(folder, steering.reset)
                except UserError:
                    raise
                except (Exception, CheckpointException) as err:  # CheckpointException is no Exception subclass
                    verdict, problem = DAMAGED, f"{type(err).__name__}: {err}"
                worst = self._worst(verdict)
            if worst == READABLE:
                log.info("resumed from %s at step %d", folder, step)
                return self._steered(step, steering)
            if problem:
                log.warning("skipping checkpoint %s: %s; trying the previous one", folder, problem)
            else:
                log.info("skipping checkpoint %s: another rank cannot load its part", folder)
        if steering.step is not None:
            self._fail(f"train.resume_step={steering.step}: the checkpoint of that step cannot be loaded (above)")
        self._set_aside(0)  # none loadable (or none at all): a fresh start never overwrites a damaged one
        return 0

    def _fail(self, message: str) -> None:
        """A user error every rank found: rank 0 says it, the others exit with its status silently."""
        if self.info.is_main:
            raise UserError(message)
        raise SystemExit(UserError.exit_code)

    def _plan(self) -> dict:
        """On rank 0: the folders to try, newest first, and what train.resume_step/train.reset still ask for."""
        steering = pending(self.cfg.train, self.store.root)
        folders = self.store.candidates()
        if steering.step is not None:
            folders = [f for f in folders if step_of(f) == steering.step]
            if not folders:
                sealed = [step_of(f) for f in self.store.candidates()]
                return {
                    "error": f"train.resume_step={steering.step}: no sealed checkpoint of that step in "
                    f"{self.store.root} (sealed: {sealed or 'none'}; `scale ckpt info {self.store.root}`)"
                }
        return {"folders": [str(f) for f in folders], "step": steering.step, "reset": list(steering.reset)}

    def _steered(self, step: int, steering: Steering) -> int:
        """Apply train.reset's 'schedules' and 'ema' after a load; set newer checkpoints aside; record it."""
        if "ema" in steering.reset and self.method.teacher is not None:
            self.engine.ema(0.0)  # teacher = student, through each engine's own EMA (sharded or not)
            log.info("train.reset: the teacher restarts as a copy of the student")
        start = 0 if "schedules" in steering.reset else step
        if start != step:
            log.info("train.reset: the step count restarts at 0 (schedules from the start), weights of step %d", step)
        aside = self._set_aside(start if start == step else -1)
        self.steered = steering != Steering()
        if self.steered and self.info.is_main:
            record(self.store.root, steering, step, aside)
        return start

    def _set_aside(self, after: int) -> Path | None:
        """Collective: rank 0 moves the checkpoints newer than step `after` aside (they are kept)."""
        aside = self.store.set_aside(after) if self.info.is_main else None
        if aside is not None:
            log.warning("moved the checkpoints newer than step %d to %s (kept, not deleted)", max(after, 0), aside)
        self._barrier()
        return aside

    def _check(self, folder: Path) -> tuple[int, object]:
        try:
            problem = check_files(folder, self.info.rank, self.info.world_size)
        except UnsafeCheckpoint as err:
            return UNSAFE, err
        return (DAMAGED, problem) if problem else (READABLE, None)

    def load(self, folder: Path, reset: tuple[str, ...] = ()) -> int:
        """Load `folder`; `reset` (train.reset) names the parts left fresh: 'optimizer' and 'data' are not read."""
        meta = self.store.read_meta(folder)
        if meta["engine"] != self.cfg.engine.kind:
            raise UserError(
                f"{folder} was written by engine '{meta['engine']}', this run uses "
                f"'{self.cfg.engine.kind}': resume with engine.kind={meta['engine']}"
            )
        optimizer = "optimizer" not in reset
        skip = tuple(name for part in reset for name in RESET_STATES.get(part, ()))
        if self.engine.native_checkpoint:
            check_deepspeed_fits(self.engine, folder / "engine", self.info.is_main)
            load_engine_files(self.engine, folder / "engine", meta["world_size"], optimizer=optimizer)
            run_state = load_torch(folder / "run_state.pt")
        else:
            state = {"engine": self.engine.state_dict(), "run": self._run_state(0, skip)}
            if not optimizer:
                state["engine"] = {k: v for k, v in state["engine"].items() if k not in ("optimizer", "scaler")}
            reader = SafeReader(str(folder / "dcp"))
            check_fits(folder, state, reader.read_metadata(), self.info.is_main)
            with rolled_back(state):  # a load that fails half-way leaves none of its tensors
                dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), process_group=self.group)
            self.engine.load_state_dict(state["engine"])
            run_state = state["run"]
        for name, value in run_state.items():
            if name in self.states and name not in skip:
                self.states[name].load_state_dict(value)
        load_states(self.states, folder, {**meta, "step": int(run_state["step"])}, skip)
        if "data" in reset:
            log.info("train.reset: the loader starts at sample 0 with its counters at 0")
        if not optimizer:
            log.info("train.reset: fresh optimizer state (moments, loss scale); weights from %s", folder)
        return int(run_state["step"])
