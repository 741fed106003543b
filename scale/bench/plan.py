"""Capacity planner: per-GPU memory and step time of a recipe for each engine, and a setting that fits.

Memory per rank, from a fake-tensor trace of one step (scale.bench.trace) and the engines' sharding rules:
- parameters, gradients, optimizer state and EMA teacher, counted as `Engine.memory()` counts them: DDP and ZeRO-1/2
  replicate the fp32 weights, FSDP2 and ZeRO-3 shard them over the ranks; gradients are sharded by FSDP2 and
  ZeRO-2/3; optimizer moments (AdamW/LAMB 2, SGD/LARS 1 per weight, fp32) are sharded by FSDP2 and every ZeRO stage,
  ZeRO-1/2 also keep a sharded fp32 master copy (ZeRO-3 in fp32/bf16 shares its weights, fp16 does not);
- activations: the bytes the forward and the loss save for backward, per image, times the micro-batch; activation
  checkpointing replaces a checkpointed block's saved tensors by its input and adds one block's recomputation;
- the weights in the autocast dtype (mixed precision, "lowp"): the DDP engine's copies of the student's trainable and
  the teacher's Linear and Conv weights and biases (scale/engine/lowp.py, 2 bytes an element, kept between steps);
  else autocast's casts of the student's weights, saved from the forward to the backward whatever the batch (an
  upper bound under checkpointing, which recomputes those of a checkpointed block); none where the weights are
  sharded (the gathered weights are transients);
- transients: the batch's crops, the gradient of the largest saved tensor, and under FSDP2/ZeRO-3 the gathered
  weights of two blocks (prefetch) plus the unsharded parts (heads);
- buffers (BatchNorm statistics, position tables).
The peak is at the end of the forward, with every activation alive: DDP and DeepSpeed hold their gradient buffers
then, FSDP2 allocates its gradient shards only as backward frees activations (its peak is the larger of the two
moments).
Step time: model FLOPs (+ recomputed forwards) at `mfu` of the GPU's peak, plus communication: the bytes each rank
sends inside its node at `bandwidth` and across nodes at `inter_bandwidth` (no overlap assumed: an upper bound).

Network: every collective is costed as a ring over its group (ranks numbered node by node): a rank sends (n-1)/n of
the full tensor for an all-gather or reduce-scatter, twice that for an all-reduce, and of a ring's n hops, one per
node the group spans crosses nodes (none when it stays in one node). Per step (one optimizer step):
- DDP: all-reduce of the fp32 gradients over every rank;
- FSDP2 (full) and ZeRO-3: all-gather of each unit's weights (compute dtype) at each forward and backward, the
  teacher's at its forwards, and a reduce-scatter of the fp32 gradients, all over every rank;
- HSDP (engine.shard_size = GPUs per node): those all-gathers and reduce-scatters inside the node only, plus an
  all-reduce of each rank's 1/G gradient shard across the nodes (one rank per node);
- ZeRO-1/2: reduce-scatter of the gradients and all-gather of the updated weights over every rank.
tests/bench/test_plan_network.py checks DDP, FSDP2 and HSDP against the collectives of one real step on gloo.
"""

from dataclasses import dataclass, field, replace

from scale.bench.mfu import step_flops
from scale.bench.steptrace import StepTrace
from scale.engine.kinds import SETTINGS, holds_low_precision_weights
from scale.errors import UserError
from scale.launch.layout import Setting

ENGINES = (*SETTINGS, "hsdp")  # the engine kinds' settings, plus HSDP (fsdp2 on a replicate x shard mesh)
SHARDED_WEIGHTS = ("fsdp2", "hsdp", "zero3")
SHARDED_GRADS = ("fsdp2", "hsdp", "zero2", "zero3")
MOMENTS = {"adamw": 2, "lamb": 2, "sgd": 1, "lars": 1}
AC_MODES = (("none", 1), ("every_n", 2), ("full", 1))
HEADROOM = 0.9  # of the GPU's memory: allocator fragmentation, CUDA context, library workspaces


@dataclass
class Prediction:
    setting: Setting
    memory: dict[str, float] = field(default_factory=dict)  # bytes per rank by component, and "total"
    compute_s: float = 0.0
    comm_s: float = 0.0
    traffic: "Traffic" = None  # bytes each rank sends per step inside its node and across nodes

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_s


def state_bytes(
    trace: StepTrace, engine: str, world: int, precision: str, optimizer: str, shard_size: int = 0
) -> dict[str, float]:
    """Parameters, gradients, optimizer state and teacher held by one rank (as Engine.memory() counts them);
    `shard_size`: the ranks HSDP shards over."""
    if engine not in ENGINES:
        raise UserError(f"engine '{engine}' is not one of {', '.join(ENGINES)}")
    if optimizer not in MOMENTS:
        raise UserError(f"optim.name '{optimizer}' is not one of {', '.join(MOMENTS)}")
    shards = (shard_size or world) if engine == "hsdp" else world
    weight_share = 1 / shards if engine in SHARDED_WEIGHTS else 1.0
    grad_share = 1 / shards if engine in SHARDED_GRADS else 1.0
    weight_bytes = 2 if (precision == "fp16" and engine.startswith("zero")) else 4
    moments = 4 * MOMENTS[optimizer] * trace.trainable
    if engine == "ddp":
        optim = moments
    elif engine in ("fsdp2", "hsdp"):
        optim = moments / shards
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
    """The blocks scale.engine.activation_checkpointing checkpoints: all (full) or every n-th from the first (every_n)."""
    return ac == "full" or (ac == "every_n" and index % every_n == 0)


def activation_bytes(trace: StepTrace, images: int, ac: str = "none", every_n: int = 2) -> float:
    """Bytes kept for backward by a micro-batch of `images` images."""
    saved = trace.net_saved + trace.loss_saved
    calls = [c for c in trace.blocks if checkpointed(c.index, ac, every_n)]
    if calls:
        saved += sum(c.inputs - c.saved for c in calls) + max(c.saved for c in calls)
    return trace.per_image(saved) * images


def lowp_bytes(trace: StepTrace, setting: Setting, precision: str) -> float:
    """The weights one rank holds in the autocast dtype at the peak (module docstring)."""
    if holds_low_precision_weights(setting.engine, precision, setting.compile):
        return 2 * (trace.student_cast + trace.teacher_cast)
    if precision == "fp32" or setting.engine in SHARDED_WEIGHTS:
        return 0.0
    return trace.weight_casts


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


@dataclass(frozen=True)
class Traffic:
    """Bytes one rank sends: to ranks of its own node, and to other nodes."""

    intra: float = 0.0
    inter: float = 0.0

    def __add__(self, other: "Traffic") -> "Traffic":
        return Traffic(self.intra + other.intra, self.inter + other.inter)

    @property
    def total(self) -> float:
        return self.intra + self.inter


def ring(op: str, payload: float, ranks: int, nodes: int) -> Traffic:
    """What one rank sends in a ring `op` (all_reduce | all_gather | reduce_scatter) whose full tensor is `payload`
    bytes, over `ranks` ranks spanning `nodes` nodes (node by node): `nodes` of the ring's hops cross nodes."""
    if ranks <= 1:
        return Traffic()
    sent = (2 if op == "all_reduce" else 1) * (ranks - 1) / ranks * payload
    cross = nodes / ranks if nodes > 1 else 0.0
    return Traffic(sent * (1 - cross), sent * cross)


def gathered_weights(trace: StepTrace, setting: Setting) -> float:
    """Weights (elements) FSDP2 / ZeRO-3 all-gather per optimizer step: each block at each backbone call and every
    other unit at each student call, forward and backward; the teacher's at its forwards."""
    backbone_calls = len(trace.blocks) / max(trace.depth, 1)
    rest = trace.params - trace.block_params
    student = 2 * (backbone_calls * trace.block_params + trace.student_calls * rest)
    teacher = trace.teacher_calls / max(trace.student_calls, 1) * (backbone_calls * trace.block_params + rest)
    return setting.grad_accum * (student + teacher)


def traffic(trace: StepTrace, setting: Setting, world: int, gpus_per_node: int, precision: str) -> Traffic:
    """Bytes each rank sends per optimizer step, inside its node and across nodes (see the module docstring)."""
    nodes = max(world // gpus_per_node, 1)
    grads = 4 * trace.trainable  # fp32 gradient reduction
    engine = setting.engine
    if engine == "ddp":
        return ring("all_reduce", grads, world, nodes)
    if engine in ("zero1", "zero2"):
        weight_bytes = 2 if precision == "fp16" else 4
        return ring("reduce_scatter", grads, world, nodes) + ring(
            "all_gather", weight_bytes * trace.trainable, world, nodes
        )
    # FSDP2 gathers in the compute dtype; ZeRO-3 gathers its weights as held (fp32, fp16 in DeepSpeed's fp16 mode)
    compute_bytes = 4 if precision == "fp32" or (engine == "zero3" and precision != "fp16") else 2
    gathered = compute_bytes * gathered_weights(trace, setting)
    if engine in ("fsdp2", "zero3"):
        return ring("all_gather", gathered, world, nodes) + ring("reduce_scatter", grads, world, nodes)
    shards = setting.shard_size or gpus_per_node  # hsdp: shard groups of consecutive ranks, replicas across them
    groups = world // shards
    in_group = ring("all_gather", gathered, shards, max(shards // gpus_per_node, 1))
    in_group += ring("reduce_scatter", grads, shards, max(shards // gpus_per_node, 1))
    return in_group + ring("all_reduce", grads / shards, groups, min(groups, nodes))


def predict(
    trace: StepTrace,
    setting: Setting,
    world: int,
    precision: str,
    optimizer: str,
    peak_flops: float,
    mfu: float,
    bandwidth: float,
    gpus_per_node: int | None = None,
    inter_bandwidth: float | None = None,
) -> Prediction:
    """One setting on `world` GPUs (`gpus_per_node` per node, default all in one): memory per rank, compute and
    communication seconds per step (`bandwidth` inside a node, `inter_bandwidth` across nodes)."""
    gpus_per_node = gpus_per_node or world
    memory = state_bytes(trace, setting.engine, world, precision, optimizer, setting.shard_size or gpus_per_node)
    memory["buffers"] = trace.buffers
    memory["activations"] = activation_bytes(trace, setting.micro_batch, setting.ac, setting.every_n)
    memory["lowp"] = lowp_bytes(trace, setting, precision)
    memory["transient"] = transient_bytes(trace, setting.micro_batch, setting.engine, precision)
    memory["total"] = peak_bytes(memory, setting.engine)
    images = setting.micro_batch * setting.grad_accum
    flops = hardware_flops(trace, images, setting.ac, setting.every_n)
    sent = traffic(trace, setting, world, gpus_per_node, precision)
    return Prediction(
        setting,
        memory,
        compute_s=flops / (peak_flops * mfu),
        comm_s=sent.intra / bandwidth + sent.inter / (inter_bandwidth or bandwidth),
        traffic=sent,
    )


def hardware_flops(trace: StepTrace, images: int, ac: str = "none", every_n: int = 2) -> float:
    """FLOPs a step computes: the model's, plus the forwards of the checkpointed blocks recomputed in backward."""
    recompute = sum(c.flops for c in trace.blocks if checkpointed(c.index, ac, every_n))
    return step_flops(trace, images) + trace.per_image(recompute) * images


def hardware_mfu(trace: StepTrace, model_mfu: float, ac: str, every_n: int = 2) -> float:
    """The fraction of the peak a step computes at (hardware FLOPs), from an MFU measured with checkpointing `ac`
    (model FLOPs: the recomputation is inside the measured time), so that a setting with other checkpointing is
    timed by the FLOPs it computes."""
    return model_mfu * hardware_flops(trace, 1, ac, every_n) / step_flops(trace, 1)


def engines_for(world: int, gpus_per_node: int) -> tuple[str, ...]:
    """HSDP is a setting of its own only when the ranks span several nodes (on one node it is FSDP2) of several
    GPUs; FSDP2 only on more than one rank: on a shard group of one rank either runs as DDP
    (scale.engine.kinds.runs_as)."""
    left = ("hsdp",) if world <= gpus_per_node or gpus_per_node == 1 else ()
    left += ("fsdp2",) if world == 1 else ()
    return tuple(e for e in ENGINES if e not in left)


def candidates(per_gpu_batch: int, engines=ENGINES, shard_size: int = 0) -> list[Setting]:
    micro = [m for m in range(per_gpu_batch, 0, -1) if per_gpu_batch % m == 0]
    return [
        Setting(engine, ac, every_n, m, per_gpu_batch // m, shard_size if engine == "hsdp" else 0)
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
    gpus_per_node: int | None = None,
    inter_bandwidth: float | None = None,
    recipe: Setting | None = None,
) -> tuple[list[Prediction], Prediction | None]:
    """Predictions of every engine with the recipe's checkpointing, micro-batch and accumulation (without a
    recipe: the full micro-batch, no checkpointing), and a proposal that fits in HEADROOM x gpu_mem.
    `recipe`: the setting the recipe runs with on this layout (scale.launch.layout.launch_setting, what `scale submit`
    launches). The proposal is the recipe's own setting when it fits; else the fastest fitting setting of its engine
    (checkpointing, micro-batch, accumulation); only when none of those fits, the fastest fitting setting of any
    engine. Without `recipe`: the fastest fitting setting of any engine."""
    gpus_per_node = gpus_per_node or world
    engines = engines_for(world, gpus_per_node)

    def run(setting):
        return predict(
            trace, setting, world, precision, optimizer, peak_flops, mfu, bandwidth, gpus_per_node, inter_bandwidth
        )

    def fits(p: Prediction) -> bool:
        return p.memory["total"] <= HEADROOM * gpu_mem

    hsdp = gpus_per_node if world > gpus_per_node else 0
    row = recipe or Setting("ddp", micro_batch=per_gpu_batch)
    table = [run(replace(row, engine=e, shard_size=hsdp if e == "hsdp" else 0)) for e in engines]
    fitting = [p for p in map(run, candidates(per_gpu_batch, engines, hsdp)) if fits(p)]
    if recipe is not None:
        own = run(recipe)
        if fits(own):
            return table, own
        same_engine = candidates(per_gpu_batch, (recipe.engine,), recipe.shard_size)
        fitting = [p for p in map(run, same_engine) if fits(p)] or fitting
    best = min(fitting, key=lambda p: (round(p.step_s, 6), ENGINES.index(p.setting.engine)), default=None)
    return table, best


def gib(value: float) -> str:
    return f"{value / 2**30:7.2f}"


def format_plan(
    trace: StepTrace,
    table: list[Prediction],
    best: Prediction | None,
    world: int,
    gpu_mem: float,
    per_gpu_batch: int,
    gpus_per_node: int | None = None,
    recipe: Setting | None = None,
) -> str:
    keys = ("params", "grads", "optimizer", "teacher", "buffers", "activations", "lowp", "transient", "total")
    nodes = world // (gpus_per_node or world)
    where = f"{nodes} node(s) x {gpus_per_node or world} GPU(s)" if nodes > 1 else f"{world} GPU(s)"
    lines = [
        f"per-GPU memory (GiB), bytes each GPU sends per step (GB, inside its node / across nodes) and step time "
        f"at {where}, {per_gpu_batch} image(s) per GPU, "
        + (f"as the recipe runs (ac={recipe.ac}, accum={recipe.grad_accum}):" if recipe else "no checkpointing:"),
        f"{'engine':9s}" + "".join(f"{k[:8]:>9s}" for k in keys) + f"{'intra GB':>9s}{'inter GB':>9s}"
        f"{'compute s':>10s}{'comm s':>9s}{'step s':>9s}  fits",
    ]
    for p in table:
        fits = "yes" if p.memory["total"] <= HEADROOM * gpu_mem else "no"
        lines.append(
            f"{p.setting.name:9s}"
            + "".join(f"{gib(p.memory[k]):>9s}" for k in keys)
            + f"{p.traffic.intra / 1e9:9.3f}{p.traffic.inter / 1e9:9.3f}"
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
            f"{best.step_s:.3f} s/step predicted" + (" (the recipe as written)" if best.setting == recipe else "")
        )
        if best.setting != recipe:
            lines.append("  overrides: " + " ".join(best.setting.overrides()))
    return "\n".join(lines)
