"""Resuming a run, top to bottom in this module:

1. `read_start` (once per launch, before any rank starts): whether the run directory can continue with this recipe,
   as each schema field declares it (scale/config/fields.py): a FIXED field (a checkpointed shape, the trained
   parameters, what the saved position means) is refused, a NOTED one is logged, any other changes freely.
2. `Resumable.resume` (every rank, the checkpointer's): the checkpoints to try, newest first, or the one
   train.resume_step names (steering, below); each rank reads its share of a checkpoint's files as data
   (scale.checkpoint.safe_load), the ranks agree, and all load the same one if it fits the run (fit, below; `load`): the engine's state through DCP
   or its own files, then every state object (scale.checkpoint.state), all rolled back when a load fails half-way;
   then train.reset's parts and the checkpoints newer than the loaded one are set aside.
"""

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from omegaconf import DictConfig, OmegaConf
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from scale.checkpoint.safe_load import SafeLoadPlanner, SafeReader, UnsafeCheckpoint, check_files, load_torch
from scale.checkpoint.state import RESET_STATES, RUN, TEACHER, load_engine_files, load_states, rolled_back
from scale.checkpoint.store import CheckpointStore, step_of
from scale.config.fields import FIXED, NOTED
from scale.config.load import from_dict
from scale.config.schema import Recipe
from scale.config.validate import get_key, schema_rules
from scale.engine.kinds import CHECKPOINT_FORMATS
from scale.errors import ConfigError, UserError
from scale.nofollow import write_atomic
from scale.readback import STEERING, BadFile, read_json

log = logging.getLogger(__name__)

# what a rank found when it read its share of a checkpoint's files; the ranks agree on the worst
READABLE, DAMAGED, UNSAFE = 0, 1, 2


def check_format(folder: Path, written_by: str, runs: str) -> None:
    """Refuse a checkpoint this run's engine cannot read: DDP and FSDP2 write and read the same DCP state on any
    number of ranks (an fsdp2 recipe that ran as DDP on one GPU resumes as FSDP2 on eight, and back); DeepSpeed's
    own files are another format."""
    ours, theirs = CHECKPOINT_FORMATS[runs], CHECKPOINT_FORMATS[written_by]
    if ours != theirs:
        raise UserError(
            f"{folder} was written by engine '{written_by}' ({theirs}), this run uses '{runs}' ({ours}): resume "
            f"with engine.kind={written_by}"
        )


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


# --- steering: deliberate changes at resume. Roll back to a chosen sealed checkpoint (train.resume_step) and reset
# parts of the saved state (train.reset). Each applies once: checkpoints/steering.json records what was applied, so
# that a requeued job launched with the same recipe continues from its newest checkpoint instead of rolling back again.

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


# --- fit: whether a checkpoint fits the run that loads it. The names and shapes of its model, optimizer and method
# tensors against the ones this run would fill. A misfit is a user error (a setting that shapes a tensor changed, or
# another run's checkpoint), never damage: it names the key and both shapes, and nothing is skipped or deleted.

# the parts of the flattened DCP state whose layout the recipe decides (not the loader's or the RNG's)
# (the model's first: a misfit is named by its parameter before its optimizer moments)
SHAPED = ("engine.student.", "engine.teacher.", "run.method.", "engine.optimizer.state.")


def flat_shapes(state: dict, prefix: str = "") -> dict[str, tuple[int, ...]]:
    """{dotted key: shape} of every tensor in nested dicts, keyed as DCP flattens them (the checkpoint's
    non-tensor items, stored as bytes, are not compared)."""
    out = {}
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_shapes(value, name + "."))
        elif isinstance(value, torch.Tensor):
            out[name] = tuple(value.shape)  # a DTensor's shape is the full one, as DCP stores it
    return out


def _has(state: dict, dotted: str) -> bool:
    node = state
    for part in dotted.rstrip(".").split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def misfit(
    wanted: dict[str, tuple[int, ...]], saved: dict[str, tuple[int, ...]], scopes: tuple[str, ...] = SHAPED
) -> str | None:
    """The first key under `scopes` whose shape differs or which only one side has, described; None when they
    fit."""
    keys = set(wanted) | set(saved)
    for key in (k for scope in scopes for k in sorted(keys) if k.startswith(scope)):
        if key not in saved:
            return f"{key} {list(wanted[key])} is not in the checkpoint"
        if key not in wanted:
            return f"the checkpoint's {key} {list(saved[key])} is not in this run's model"
        if saved[key] != wanted[key]:
            return f"{key} is {list(saved[key])} in the checkpoint, {list(wanted[key])} in this run"
    return None


def check_fits(folder, state: dict, metadata: Metadata, main: bool = True) -> None:
    """Raise UserError when the DCP checkpoint described by `metadata` cannot fill `state`. Every rank finds the
    same: only the `main` one says why, the others exit with the same status silently."""
    saved = {k: tuple(v.size) for k, v in metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    scopes = tuple(p for p in SHAPED if _has(state, p))  # a part left out on purpose (train.reset) is not read
    refuse(folder, misfit(flat_shapes(state), saved, scopes), main)


def refuse(folder, problem: str | None, main: bool = True) -> None:
    """A misfit (`problem`) ends the run as a user error, said by the `main` rank only; None: nothing to do."""
    if problem and not main:
        raise SystemExit(UserError.exit_code)
    if problem:
        raise UserError(
            f"{folder} does not fit this run: {problem}. A setting that shapes it changed since the checkpoint "
            "was written (or it is another run's); nothing was loaded or deleted. Restore the setting, or start a "
            "new run from its weights (train.init_weights). See docs/how-to/resume.md."
        )


def check_deepspeed_fits(engine, folder, is_main: bool) -> None:
    """The same for a DeepSpeed engine's own files in `folder` (DeepSpeed's load would fail half-way); nothing is
    loaded. ZeRO-1/2: every weight and buffer of the model states file and teacher.pt; ZeRO-3: the parameter shapes
    DeepSpeed records against each parameter's `ds_shape`. The files are mapped, not read (`mmap`): only
    DeepSpeed's load reads the weights again."""
    from scale.engine.deepspeed import CHECKPOINT_TAG

    states = sorted((folder / CHECKPOINT_TAG).glob("*model_states.pt"))
    if not states:
        return  # DeepSpeed's load says there is no checkpoint
    saved_states = load_torch(states[0], mmap=True)  # shapes only: the weights are never read
    module = engine.ds.module
    if engine.stage == 3:
        recorded = saved_states["param_shapes"] + [saved_states.get("frozen_param_shapes") or {}]
        saved = {f"engine.student.{k}": tuple(v) for group in recorded for k, v in group.items()}
        wanted = {f"engine.student.{n}": tuple(p.ds_shape) for n, p in module.named_parameters()}
    else:
        saved = {f"engine.student.{k}": tuple(v.shape) for k, v in saved_states["module"].items()}
        wanted = {f"engine.student.{k}": tuple(v.shape) for k, v in module.state_dict().items()}
        if engine.method.teacher is not None and (folder / TEACHER).is_file():
            teacher = load_torch(folder / TEACHER, mmap=True)
            saved |= {f"engine.teacher.{k}": tuple(v.shape) for k, v in teacher.items()}
            wanted |= {f"engine.teacher.{k}": tuple(v.shape) for k, v in engine.teacher_state().items()}
    refuse(folder.parent, misfit(wanted, saved, ("engine.student.", "engine.teacher.")), is_main)


class Resumable:
    """The resume half of the Checkpointer (scale.checkpoint.checkpointer), and the collectives both halves use:
    the ranks of the data-parallel group load together."""

    def _run_state(self, step: int, skip: tuple[str, ...] = ()) -> dict:
        """The RUN states with the step: saved inside the engine's checkpoint."""
        return {"step": step, **{k: self.states[k].state_dict() for k in RUN if k in self.states and k not in skip}}

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
                start = self._steered(step, steering)
                if self.info.is_main:
                    self.store.record_unrecorded()  # a sealed step whose killed seal left saves.jsonl without it
                return start
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
        try:
            steering = pending(self.cfg.train, self.store.root)
        except UserError as err:  # a damaged steering.json: said by rank 0, every rank stops (not a hang)
            return {"error": str(err)}
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
        check_format(folder, meta["engine"], self.engine.kind)
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
