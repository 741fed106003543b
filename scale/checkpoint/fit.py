"""Whether a checkpoint fits the run that loads it: the names and shapes of its model, optimizer and method tensors
against the ones this run would fill. A misfit is a user error (a setting that shapes a tensor changed, or another
run's checkpoint), never damage: it names the key and both shapes, and nothing is skipped or deleted."""

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from scale.errors import UserError

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
    from scale.checkpoint.safe_load import load_torch  # the files were read as data before (check_files)
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
        if engine.method.teacher is not None and (folder / "teacher.pt").is_file():
            teacher = load_torch(folder / "teacher.pt", mmap=True)
            saved |= {f"engine.teacher.{k}": tuple(v.shape) for k, v in teacher.items()}
            wanted |= {f"engine.teacher.{k}": tuple(v.shape) for k, v in engine.teacher_state().items()}
    refuse(folder.parent, misfit(wanted, saved, ("engine.student.", "engine.teacher.")), is_main)
