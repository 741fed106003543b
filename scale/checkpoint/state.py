"""Everything a checkpoint holds besides the engine's own state is a state object of torch's `Stateful` protocol
(state_dict / load_state_dict), handed to the checkpointer by name (`run_states`); the table below says where each
one's dict lives in a step folder (the layout checkpoints have always had, so old ones load). The engine's own
state goes through DCP (DDP, FSDP2) or through its own files (DeepSpeed: `save_engine_files` /
`load_engine_files`); this module, not the engine, opens every file of a checkpoint (the teacher's, the model
states' buffers) and reads it through scale.checkpoint.safe_load. A load that fails half-way is rolled back the same
way for every engine (`rolled_back`): the engine only says which tensors a load writes.

RNG: per-rank states (python, numpy, torch, CUDA) as plain tensors and ints, so they load with weights_only."""

import contextlib
import json
import logging
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

from scale.checkpoint.safe_load import load_torch
from scale.readback import DATA_COUNTERS, BadFile, read_json

log = logging.getLogger(__name__)

# where each state object's dict lives in a step folder
RUN = ("method", "loader")  # with the step, inside the engine's checkpoint (DCP's "run" item, or run_state.pt)
PER_RANK = {"rng": "rng/rank{rank}.pt", "counters": "data_counters/rank{rank}.json"}  # each rank's own file
ON_MAIN = {"monitors": "monitors.pt"}  # the same on every rank: written by rank 0
# train.reset's entries that leave state objects fresh (the optimizer's is the engine's: scale.checkpoint.resume)
RESET_STATES = {"data": ("loader", "counters")}
TEACHER, TEACHER_SHARD = "teacher.pt", "teacher_rank{rank}.pt"  # beside DeepSpeed's files: ZeRO-1/2, ZeRO-3


def capture() -> dict:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, state, gauss_next = random.getstate()
    out = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": {"version": version, "state": list(state), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def restore(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class RankFiles:
    """The saved dicts of one PER_RANK state, one file per saving rank, read on first use (an RNG state at the
    same world size reads this rank's file only). `get(rank)`: None when that rank saved none (a checkpoint older
    than the state)."""

    def __init__(self, folder: Path, pattern: str):
        self.folder, self.pattern = folder, pattern

    def path(self, rank: int) -> Path:
        return self.folder / self.pattern.format(rank=rank)

    def ranks(self) -> list[int]:
        found = self.path(0).parent.glob(Path(self.pattern.format(rank="*")).name)
        return sorted(int(p.stem.removeprefix("rank")) for p in found)

    def get(self, rank: int) -> dict | None:
        path = self.path(rank)
        if not path.is_file():
            return None
        state = read_json(path, DATA_COUNTERS) if path.suffix == ".json" else load_torch(path)
        if not isinstance(state, dict):
            raise ValueError(f"{path}: a {type(state).__name__}, not a dict")
        return state


class RngState:
    """This rank's random streams. At another world size than the checkpoint's: fresh, reproducible streams per
    rank, distinct from the first run's."""

    def __init__(self, seed: int, rank: int, world_size: int):
        self.seed, self.rank, self.world_size = seed, rank, world_size

    def state_dict(self) -> dict:
        return capture()

    def load_state_dict(self, saved: dict) -> None:
        """`saved`: {"world_size", "step", "ranks": RankFiles} (the PER_RANK form)."""
        own = saved["ranks"].get(self.rank) if saved["world_size"] == self.world_size else None
        if own is not None:
            restore(own)
            return
        from scale.engine.dist import seed_everything

        seed_everything(self.seed + 1_000_003 * (1 + int(saved["step"])), self.rank)


class DataCounters:
    """The loader's counters (data/samples, data/errors, the error budget's count): this rank's at the same world
    size; at another, an even share of every saved rank's. A checkpoint without them (older, or unreadable ones):
    they start at 0."""

    def __init__(self, loader, rank: int, world_size: int):
        self.loader, self.rank, self.world_size = loader, rank, world_size

    def state_dict(self) -> dict:
        return self.loader.counters()

    def load_state_dict(self, saved: dict) -> None:
        self.loader.load_counters(self.share(saved))

    def share(self, saved: dict) -> dict:
        files: RankFiles = saved["ranks"]
        try:
            every = {rank: files.get(rank) for rank in files.ranks()}
        except (OSError, ValueError, BadFile) as err:
            log.warning("data counters in %s unreadable (%s): they start at 0", files.folder, err)
            return {}
        if saved["world_size"] == self.world_size:
            return every.get(self.rank) or {}
        kinds = {kind for state in every.values() for kind in state.get("errors", {})}
        total = {
            "samples": sum(state.get("samples", 0) for state in every.values()),
            "epoch_errors": sum(state.get("epoch_errors", 0) for state in every.values()),
            **{kind: sum(state.get("errors", {}).get(kind, 0) for state in every.values()) for kind in kinds},
        }
        rank, size = self.rank, self.world_size
        share = {key: n // size + (rank < n % size) for key, n in total.items()}
        return {
            "samples": share["samples"],
            "epoch_errors": share["epoch_errors"],
            "errors": {k: share[k] for k in kinds},
        }


def run_states(method, loader, monitors, info, seed: int) -> dict[str, Stateful]:
    """What a training run checkpoints besides the engine: the method's own state (centers, queues), the loader's
    position and counters, this rank's RNG, the loop's monitors (k-NN queue, gradient history, online probe). The
    EMA teacher is the engine's; train.resume_step/train.reset are recorded by scale.checkpoint.resume."""
    return {
        "method": method,
        "loader": loader,
        "rng": RngState(seed, info.rank, info.world_size),
        "counters": DataCounters(loader, info.rank, info.world_size),
        "monitors": monitors,
    }


def write_torch(obj, path: Path) -> None:
    """torch.save through a Python file: a full disk is then an OSError with its errno (torch's own file writer
    raises a RuntimeError, 'unexpected pos')."""
    with open(path, "wb") as f:
        torch.save(obj, f)


def write_states(states: dict[str, Stateful], folder: Path, rank: int, main: bool) -> None:
    """The PER_RANK and ON_MAIN states into a step folder (the RUN ones go with the engine's checkpoint). Every
    state_dict is taken before any file is written, on every rank: a monitor's is a collective, which a rank whose
    write failed (a full disk) must not leave the others waiting in."""
    own = {
        name: (pattern.format(rank=rank), states[name].state_dict())
        for name, pattern in PER_RANK.items()
        if name in states
    }
    shared = {name: (file, states[name].state_dict()) for name, file in ON_MAIN.items() if name in states}
    for file, state in [*own.values(), *(shared.values() if main else ())]:
        path = folder / file
        path.parent.mkdir(exist_ok=True)
        if path.suffix == ".json":
            path.write_text(json.dumps(state))
        else:
            write_torch(state, path)


def load_states(states: dict[str, Stateful], folder: Path, meta: dict, skip: tuple[str, ...] = ()) -> None:
    """The PER_RANK and ON_MAIN states from a step folder, but those in `skip` (left fresh). An ON_MAIN file a
    checkpoint lacks (written before that state was saved) leaves its state fresh."""
    for name, pattern in PER_RANK.items():
        if name in states and name not in skip:
            ranks = RankFiles(folder, pattern)
            states[name].load_state_dict({"world_size": meta["world_size"], "step": meta["step"], "ranks": ranks})
    for name, file in ON_MAIN.items():
        if name in states and name not in skip and (folder / file).exists():
            states[name].load_state_dict(load_torch(folder / file))


# --- the engine's own files (DeepSpeed)


def teacher_file(engine, rank: int) -> str | None:
    """The file of the teacher this rank writes and reads beside a DeepSpeed engine's, None for none."""
    if engine.method.teacher is None:
        return None
    return TEACHER_SHARD.format(rank=rank) if engine.stage == 3 else TEACHER


def save_engine_files(engine, folder: Path) -> None:
    """Collective: the engine's own files (DeepSpeed's save), then the teacher beside them."""
    folder = Path(folder)
    engine.save_native(folder)
    info = engine.dist_info
    name = teacher_file(engine, info.rank)
    if name is not None and (engine.stage == 3 or info.is_main):
        write_torch(engine.teacher_state(), folder / name)


def load_engine_files(engine, folder: Path, saved_world_size: int, optimizer: bool = True) -> None:
    """Collective: the engine's own load (on another world size, through DeepSpeed's universal form), the model's
    buffers from the first model states file when the world size changed (the universal form holds parameters
    only), the teacher. All or nothing: a failure rolls every tensor back."""
    folder = Path(folder)
    elastic = saved_world_size != engine.dist_info.world_size
    live, undo = engine.rollback_point(moments=elastic_form(engine, folder))
    with rolled_back(live, undo):
        engine.load_native(folder, saved_world_size, optimizer=optimizer)
        if elastic:
            states = sorted((folder / engine.checkpoint_tag).glob("*model_states.pt"))[0]
            engine.load_buffers(load_torch(states)["module"], states)
        name = teacher_file(engine, engine.dist_info.rank)
        if name is not None:
            engine.load_teacher_state(load_torch(folder / name), folder / name)


def elastic_form(engine, folder: Path) -> bool:
    """Whether a ZeRO-1/2 checkpoint's optimizer states are in DeepSpeed's `elastic_checkpoint` form (every
    partition's moments in one list, not a torch optimizer state dict), whose load copies into the live moments
    instead of replacing them. Mapped, not read: the moments are read by DeepSpeed's load only."""
    files = sorted((folder / engine.checkpoint_tag).glob("*optim_states.pt"))
    if engine.stage == 3 or not files:
        return False
    saved = load_torch(files[0], mmap=True).get("optimizer_state_dict", {})
    return "base_optimizer_state" in saved and not isinstance(saved["base_optimizer_state"], dict)


# --- rollback


def tensors_in(state) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state.to_local() if isinstance(state, DTensor) else state]
    if isinstance(state, dict):
        return [t for value in state.values() for t in tensors_in(value)]
    if isinstance(state, (list, tuple)):
        return [t for value in state for t in tensors_in(value)]
    return []


@contextlib.contextmanager
def rolled_back(live, undo: Callable[[], None] | None = None) -> Iterator[None]:
    """Around a load into live tensors (DCP and DeepSpeed load into the module's own): a CPU copy of every tensor
    in `live` (nested dicts, lists; this rank's shard of a DTensor) is taken first and written back when the load
    fails, so that the model is never part old, part new; then `undo` restores what the engine keeps besides
    tensors (DeepSpeed: its optimizer's state and groups, its step counters)."""
    saved = [(t, t.detach().to("cpu", copy=True)) for t in tensors_in(live)]
    try:
        yield
    except BaseException:
        with torch.no_grad():
            for tensor, copy in saved:
                tensor.copy_(copy)
        if undo is not None:
            undo()
        raise
