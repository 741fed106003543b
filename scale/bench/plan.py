"""Capacity planner: per-GPU memory and step time of a recipe for each engine, and a setting that fits.

Memory per rank, from a fake-tensor trace of one step (scale.bench.trace) and the engines' sharding rules:
- parameters, gradients, optimizer state and EMA teacher, counted as `Engine.memory()` counts them: DDP and ZeRO-1/2
  replicate the fp32 weights, FSDP2 and ZeRO-3 shard them over the ranks; gradients are sharded by FSDP2 and
  ZeRO-2/3; optimizer moments (AdamW/LAMB 2, SGD/LARS 1 per weight, fp32) are sharded by FSDP2 and every ZeRO stage,
  ZeRO-1/2 also keep a sharded fp32 master copy (ZeRO-3 in fp32/bf16 shares its weights, fp16 does not);
- activations: the bytes the forward and the loss save for backward, per image, times the micro-batch; activation
  checkpointing replaces a checkpointed block's saved tensors by its input and adds one block's recomputation;
- transients: the batch's crops, the gradient of the largest saved tensor, and under FSDP2/ZeRO-3 the gathered
  weights of two blocks (prefetch) plus the unsharded parts (heads);
- buffers (BatchNorm statistics, position tables).
The peak is at the end of the forward, with every activation alive: DDP and DeepSpeed hold their gradient buffers
then, FSDP2 allocates its gradient shards only as backward frees activations (its peak is the larger of the two
moments).
Step time: model FLOPs (+ recomputed forwards) at `mfu` of the GPU's peak, plus communication at `bandwidth`
(ring collectives, (N-1)/N of the bytes per rank each way, no overlap assumed: an upper bound).
"""

from dataclasses import dataclass, field

from scale.bench.flops import step_flops
from scale.bench.trace import StepTrace
from scale.engine.kinds import SETTINGS, setting_overrides
from scale.errors import UserError

ENGINES = tuple(SETTINGS)
SHARDED_WEIGHTS = ("fsdp2", "zero3")
SHARDED_GRADS = ("fsdp2", "zero2", "zero3")
MOMENTS = {"adamw": 2, "lamb": 2, "sgd": 1, "lars": 1}
AC_MODES = (("none", 1), ("every_n", 2), ("full", 1))
HEADROOM = 0.9  # of the GPU's memory: allocator fragmentation, CUDA context, library workspaces


@dataclass(frozen=True)
class Setting:
    engine: str
    ac: str = "none"  # none | every_n | full
    every_n: int = 2
    micro_batch: int = 1  # images per rank per forward
    grad_accum: int = 1

    def label(self) -> str:
        ac = f"every_{self.every_n}" if self.ac == "every_n" else self.ac
        return f"{self.engine} ac={ac} micro={self.micro_batch} accum={self.grad_accum}"

    def overrides(self) -> list[str]:
        engine = setting_overrides(self.engine)
        ac = [f"engine.activation_checkpointing={self.ac}"] + (
            [f"engine.ac_every_n={self.every_n}"] if self.ac == "every_n" else []
        )
        return engine + ac + [f"engine.grad_accum={self.grad_accum}"]


@dataclass
class Prediction:
    setting: Setting
    memory: dict[str, float] = field(default_factory=dict)  # bytes per rank by component, and "total"
    compute_s: float = 0.0
    comm_s: float = 0.0

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_s


def state_bytes(trace: StepTrace, engine: str, world: int, precision: str, optimizer: str) -> dict[str, float]:
    """Parameters, gradients, optimizer state and teacher held by one rank (as Engine.memory() counts them)."""
    if engine not in ENGINES:
        raise UserError(f"engine '{engine}' is not one of {', '.join(ENGINES)}")
    if optimizer not in MOMENTS:
        raise UserError(f"optim.name '{optimizer}' is not one of {', '.join(MOMENTS)}")
    weight_share = 1 / world if engine in SHARDED_WEIGHTS else 1.0
    grad_share = 1 / world if engine in SHARDED_GRADS else 1.0
    weight_bytes = 2 if (precision == "fp16" and engine.startswith("zero")) else 4
    moments = 4 * MOMENTS[optimizer] * trace.trainable
    if engine == "ddp":
        optim = moments
    elif engine == "fsdp2":
        optim = moments / world
    else:
        separate_master = engine in ("zero1", "zero2") or weight_bytes != 4
        optim = (moments + (4 * trace.trainable if separate_master else 0)) / world
    return {
        "params": weight_bytes * trace.params * weight_share,
        "grads": weight_bytes * trace.trainable * grad_share,
        "optimizer": optim,
        "teacher": weight_bytes * trace.teacher_params * weight_share,
    }


def checkpointed(index: int, ac: str, every_n: int) -> bool:
    """The blocks scale.engine.activation checkpoints: all (full) or every n-th from the first (every_n)."""
    return ac == "full" or (ac == "every_n" and index % every_n == 0)


def activation_bytes(trace: StepTrace, images: int, ac: str = "none", every_n: int = 2) -> float:
    """Bytes kept for backward by a micro-batch of `images` images."""
    saved = trace.net_saved + trace.loss_saved
    calls = [c for c in trace.blocks if checkpointed(c.index, ac, every_n)]
    if calls:
        saved += sum(c.inputs - c.saved for c in calls) + max(c.saved for c in calls)
    return trace.per_image(saved) * images


def transient_bytes(trace: StepTrace, images: int, engine: str, precision: str) -> float:
    out = trace.per_image(trace.input_bytes + trace.largest_saved) * images
    if engine in SHARDED_WEIGHTS:
        compute_bytes = 4 if precision == "fp32" else 2
        per_block = trace.block_params / max(trace.depth, 1)
        out += compute_bytes * (2 * per_block + trace.params - trace.block_params)
    return out


def peak_bytes(memory: dict[str, float], engine: str) -> float:
    total = sum(memory.values())
    if engine != "fsdp2":
        return total
    return max(total - memory["grads"], total - memory["activations"])


def comm_bytes(trace: StepTrace, setting: Setting, world: int, precision: str) -> float:
    """Bytes each rank sends per optimizer step (ring: (N-1)/N of each collective's size)."""
    if world == 1:
        return 0.0
    share = (world - 1) / world
    reduce = 4 * trace.trainable  # fp32 gradient reduction
    if setting.engine not in SHARDED_WEIGHTS:  # all-reduce = reduce-scatter + all-gather
        return 2 * share * reduce
    compute_bytes = 4 if precision == "fp32" else 2
    backbone_calls = len(trace.blocks) / max(trace.depth, 1)
    rest = trace.params - trace.block_params
    student = 2 * (backbone_calls * trace.block_params + trace.student_calls * rest)  # forward and backward
    teacher = trace.teacher_calls / max(trace.student_calls, 1) * (backbone_calls * trace.block_params + rest)
    return share * (compute_bytes * setting.grad_accum * (student + teacher) + reduce)


def predict(
    trace: StepTrace,
    setting: Setting,
    world: int,
    precision: str,
    optimizer: str,
    peak_flops: float,
    mfu: float,
    bandwidth: float,
) -> Prediction:
    """One setting on `world` GPUs: memory per rank, compute and communication seconds per step."""
    memory = state_bytes(trace, setting.engine, world, precision, optimizer)
    memory["buffers"] = trace.buffers
    memory["activations"] = activation_bytes(trace, setting.micro_batch, setting.ac, setting.every_n)
    memory["transient"] = transient_bytes(trace, setting.micro_batch, setting.engine, precision)
    memory["total"] = peak_bytes(memory, setting.engine)
    images = setting.micro_batch * setting.grad_accum
    recompute = sum(c.flops for c in trace.blocks if checkpointed(c.index, setting.ac, setting.every_n))
    flops = step_flops(trace, images) + trace.per_image(recompute) * images
    return Prediction(
        setting,
        memory,
        compute_s=flops / (peak_flops * mfu),
        comm_s=comm_bytes(trace, setting, world, precision) / bandwidth,
    )


def candidates(per_gpu_batch: int, engines=ENGINES) -> list[Setting]:
    micro = [m for m in range(per_gpu_batch, 0, -1) if per_gpu_batch % m == 0]
    return [
        Setting(engine, ac, every_n, m, per_gpu_batch // m)
        for engine in engines
        for ac, every_n in AC_MODES
        for m in micro
    ]


def plan(
    trace: StepTrace,
    per_gpu_batch: int,
    world: int,
    gpu_mem: float,
    precision: str,
    optimizer: str,
    peak_flops: float,
    mfu: float,
    bandwidth: float,
) -> tuple[list[Prediction], Prediction | None]:
    """Predictions of every engine at the full micro-batch without checkpointing, and the fastest predicted
    setting (engine, checkpointing, micro-batch, accumulation) whose memory fits in HEADROOM x gpu_mem."""

    def run(setting):
        return predict(trace, setting, world, precision, optimizer, peak_flops, mfu, bandwidth)

    table = [run(Setting(engine, micro_batch=per_gpu_batch)) for engine in ENGINES]
    fitting = [p for p in map(run, candidates(per_gpu_batch)) if p.memory["total"] <= HEADROOM * gpu_mem]
    best = min(fitting, key=lambda p: (round(p.step_s, 6), ENGINES.index(p.setting.engine)), default=None)
    return table, best


def gib(value: float) -> str:
    return f"{value / 2**30:7.2f}"


def format_plan(
    trace: StepTrace, table: list[Prediction], best: Prediction | None, world: int, gpu_mem: float, per_gpu_batch: int
) -> str:
    keys = ("params", "grads", "optimizer", "teacher", "buffers", "activations", "transient", "total")
    lines = [
        f"per-GPU memory (GiB) and step time at {world} GPU(s), {per_gpu_batch} image(s) per GPU, no checkpointing:",
        f"{'engine':8s}" + "".join(f"{k[:8]:>9s}" for k in keys) + f"{'compute s':>10s}{'comm s':>9s}"
        f"{'step s':>9s}  fits",
    ]
    for p in table:
        fits = "yes" if p.memory["total"] <= HEADROOM * gpu_mem else "no"
        lines.append(
            f"{p.setting.engine:8s}"
            + "".join(f"{gib(p.memory[k]):>9s}" for k in keys)
            + f"{p.compute_s:10.3f}{p.comm_s:9.3f}{p.step_s:9.3f}  {fits}"
        )
    none, full = (activation_bytes(trace, 1, ac) for ac in ("none", "full"))
    lines.append(
        f"activations per image: {none / 2**20:.1f} MiB without checkpointing, {full / 2**20:.1f} MiB "
        f"with full checkpointing; model FLOPs per image {step_flops(trace, 1) / 1e9:.1f} G"
    )
    if best is None:
        lines.append(f"no setting fits in {HEADROOM:.0%} of {gpu_mem / 2**30:.0f} GiB: use more GPUs")
    else:
        lines.append(
            f"proposed: {best.setting.label()}: {gib(best.memory['total']).strip()} GiB, "
            f"{best.step_s:.3f} s/step predicted"
        )
        lines.append("  overrides: " + " ".join(best.setting.overrides()))
    return "\n".join(lines)
