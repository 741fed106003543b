"""The host's share of a training step, countable on a CPU: per phase of the training loop's own step
(`scale.loop.step.TrainStep`), the ops it dispatches, those that start device work ("launching"), the copies and
dtype casts among them, the DTensor dispatches and the host reads of device values (syncs), and the host
milliseconds per step. It is the CPU half of a GPU profile: the counts are the same on every device and do not
depend on the batch size, so a change that adds per-parameter work shows here without a GPU.

Counts come from a TorchDispatchMode, which sees each op after autograd and autocast (a `linear` as its `t` and
`addmm`, autocast's casts as `_to_copy`); an op on DTensors counts once (its local op runs below the mode). Host
milliseconds come from steps run without the counter; on a CPU they include the computation itself (run a narrow
model to see the dispatch cost), on a GPU they are the host's time to issue the step.
"""

import contextlib
import time
import traceback
from collections import Counter, defaultdict

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from scale.engine.kinds import describe

# the training step's phases, in order (TrainStep and the engine enter them; "other" is outside every phase)
PHASES = ("data", "forward", "backward", "guard", "clip", "optimizer", "ema", "metrics", "other")
COUNTS = ("ops", "launching", "copies", "casts", "dtensor", "syncs")
# ops that allocate or describe memory without running a kernel
NO_KERNEL = {
    "aten::empty",
    "aten::empty_strided",
    "aten::empty_like",
    "aten::new_empty",
    "aten::new_empty_strided",
    "aten::resize_",
    "aten::set_",
    "aten::_local_scalar_dense",  # a device-to-host copy, counted as a sync
    "aten::scalar_tensor",  # a Python number wrapped for an op: a host scalar on every device
    "aten::_unsafe_view",  # a view its schema does not mark as one
}
COPIES = {"aten::_to_copy", "aten::copy_", "aten::clone", "aten::_foreach_copy_", "aten::_copy_from"}


def launches(func) -> bool:
    """Whether the op starts device work: not a view (outputs aliasing an input without writing), not an allocation,
    not a metadata query (no tensor returned and none written)."""
    schema = func._schema
    if schema.name in NO_KERNEL:
        return False
    tensors_out = [r for r in schema.returns if "Tensor" in str(r.type)]
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    if not tensors_out and not writes:
        return False
    views = [r for r in tensors_out if r.alias_info is not None and not r.alias_info.is_write]
    return writes or len(views) < len(tensors_out)


def foreach_launches(name: str, args) -> int:
    """Launches of an op: one, except a `_foreach_` op whose lists pair tensors of different shapes (a list of 0-d
    factors beside the gradients): CUDA runs those one kernel per tensor (its fused path needs equal shapes)."""
    if not name.startswith("aten::_foreach_"):
        return 1
    lists = [a for a in args if isinstance(a, (list, tuple)) and a and torch.is_tensor(a[0])]
    first = lists[0]
    if any(x.shape != y.shape for other in lists[1:] for x, y in zip(first, other, strict=True)):
        return len(first)
    return 1


def _dtype(value):
    return value.dtype if torch.is_tensor(value) else None


def is_cast(name: str, args, kwargs) -> bool:
    if name == "aten::_to_copy":
        return kwargs.get("dtype") not in (None, args[0].dtype)
    if name in ("aten::copy_", "aten::_copy_from"):
        return _dtype(args[0]) != _dtype(args[1])
    if name == "aten::_foreach_copy_":
        return any(d.dtype != s.dtype for d, s in zip(args[0], args[1], strict=True))
    return False


class SyncCounter(TorchDispatchMode):
    """Counts host reads of tensor values, keeping where each happened: aten._local_scalar_dense (`.item()`,
    `bool()`, `float()`, `.tolist()` of a device tensor) and, because a CPU tensor's `.tolist()` reads its memory
    without dispatching an op, every Python call of `Tensor.tolist`."""

    def __init__(self):
        super().__init__()
        self.places: list[str] = []

    def _record(self) -> None:
        self.places.append("".join(traceback.format_stack(limit=7)[:-2]))

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile runs its graphs under this mode instead of refusing them; under the aot_eager backend
        # their ops still dispatch one by one, so a host read inside a compiled graph is counted too
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self._record()
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        tolist = torch.Tensor.tolist

        def counted(tensor):
            self._record()
            return tolist(tensor)

        self._tolist, torch.Tensor.tolist = tolist, counted
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)


class Phases:
    """The step's `phase` hook: which phase runs now (the innermost entered), and the host seconds spent in each,
    exclusive of the phases entered inside it."""

    def __init__(self):
        self.stack = ["other"]
        self.seconds: dict[str, float] = defaultdict(float)
        self.mark = time.perf_counter()

    @property
    def current(self) -> str:
        return self.stack[-1]

    def _switch(self) -> None:
        now = time.perf_counter()
        self.seconds[self.current] += now - self.mark
        self.mark = now

    @contextlib.contextmanager
    def __call__(self, name: str):
        self._switch()
        self.stack.append(name)
        try:
            yield
        finally:
            self._switch()
            self.stack.pop()

    def reset(self) -> None:
        self.seconds.clear()
        self.mark = time.perf_counter()


class OpCounter(SyncCounter):
    """`COUNTS` per phase of `phases` (a `Phases`), for the ops dispatched while it is entered."""

    def __init__(self, phases: Phases):
        super().__init__()
        self.phases = phases
        self.counts: dict[str, Counter] = defaultdict(Counter)
        self.launched: dict[str, Counter] = defaultdict(Counter)  # per phase: launches by op name
        self._launches: dict = {}  # per op overload: its schema is read once

    def _record(self) -> None:
        self.counts[self.phases.current]["syncs"] += 1
        super()._record()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        counts = self.counts[self.phases.current]
        counts["ops"] += 1
        if func not in self._launches:
            self._launches[func] = launches(func)
        name = func._schema.name
        if self._launches[func]:
            n = foreach_launches(name, args)
            counts["launching"] += n
            self.launched[self.phases.current][name] += n
        if name in COPIES:
            counts["copies"] += 1
            counts["casts"] += is_cast(name, args, kwargs)
        if any(issubclass(t, DTensor) for t in types):
            counts["dtensor"] += 1
        return super().__torch_dispatch__(func, types, args, kwargs)

    def total(self, key: str, phases=PHASES) -> int:
        return sum(self.counts[p][key] for p in phases)


def count_step(trainer, step: int, batches) -> OpCounter:
    """The counts of one step (batch included) of `trainer`, a TrainStep built with a `Phases` as its hook."""
    phases = trainer.phase
    with OpCounter(phases) as counter:
        with phases("data"):
            batch, _ = trainer.next_batch(batches)
        trainer(step, batch, log=False)
    return counter


def host_budget(cfg, info, device, steps: int = 3, warmup: int = 1, synthetic: bool = True) -> dict:
    """One setting's counts (of the step after `warmup` steps) and host ms per phase (mean of `steps` more steps,
    each a non-log step of the loop: the counted one reads nothing on the host)."""
    from scale.bench.run import bench_trainer

    phases = Phases()
    trainer = bench_trainer(cfg, info, device, synthetic, phase=phases)
    batches = trainer.batches()
    for step in range(warmup):
        trainer(step, trainer.next_batch(batches)[0], log=False)
    counter = count_step(trainer, warmup, batches)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    phases.reset()
    for step in range(warmup + 1, warmup + 1 + steps):
        with phases("data"):
            batch, _ = trainer.next_batch(batches)
        trainer(step, batch, log=False)
    phases._switch()
    ms = {p: 1000 * phases.seconds.get(p, 0.0) / steps for p in PHASES}
    sync()
    rows = {p: {**{k: counter.counts[p][k] for k in COUNTS}, "host_ms": ms[p]} for p in PHASES}
    rows["total"] = {k: sum(rows[p][k] for p in PHASES) for k in (*COUNTS, "host_ms")}
    engine = describe(cfg.engine.kind, trainer.engine.kind, info.world_size)  # what ran: 'ddp (fsdp2 on one rank)'
    return {"phases": rows, "engine": engine, "precision": cfg.engine.precision, "device": str(device)}


def format_budget(result: dict) -> str:
    lines = [f"  {'phase':10s} " + " ".join(f"{k:>9s}" for k in (*COUNTS, "host_ms"))]
    for phase, row in result["phases"].items():
        values = " ".join(f"{row[k]:9d}" for k in COUNTS)
        lines.append(f"  {phase:10s} {values} {row['host_ms']:9.1f}")
    return "\n".join(lines)
