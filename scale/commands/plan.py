"""scale plan RECIPE [overrides] (--gpus N | --nodes N --gpus-per-node G) [--gpu NAME | --gpu-mem GB]
[--gpu-tflops T] [--mfu F]: first the recipe exactly as `scale submit` launches it (engine, shard size, activation
checkpointing, micro-batch, accumulation, precision, compile: scale.launch.layout.launch_setting, the one function both
use) and whether it fits; then per-GPU memory, the bytes each GPU sends per step inside its node and across nodes,
and step time of each engine (DDP, FSDP2, HSDP, ZeRO-1/2/3); then a setting that fits. Step time is calibrated from
the measured device rows (scale/bench/measured.yaml) of the same card and model family; the line says which."""

from dataclasses import dataclass

from scale.bench.gpus import DEFAULT_GPU, GPUS

# said by `scale plan --help` and `scale submit --help`: why the first call is slow
TRACE_NOTE = (
    "The first call for a recipe traces one training step on fake tensors (imports torch: seconds) and keeps the "
    "result in $XDG_CACHE_HOME/scale/traces (default ~/.cache/scale/traces); later calls with the same model, "
    "method, data, optimizer, engine and train settings and the same scale, torch and timm read it (no torch). The "
    "verdict line ends in (traced) or (cached trace)."
)


def add_gpu_arguments(parser) -> None:
    """The GPU the job is planned for: `scale plan` and `scale submit` (its verdict) take the same options."""
    parser.add_argument(
        "--gpu",
        choices=sorted(GPUS),
        metavar="MODEL",
        help=f"GPU model: its memory and peak ({', '.join(sorted(GPUS))}); default: this machine's GPU, "
        f"else {DEFAULT_GPU}",
    )
    parser.add_argument("--gpu-mem", type=float, help="memory per GPU, GiB; overrides --gpu's")
    parser.add_argument(
        "--gpu-tflops", type=float, help="peak TFLOP/s of one GPU in the recipe's precision (default: the GPU's)"
    )
    parser.add_argument(
        "--mfu",
        type=float,
        help="fraction of the peak a step computes at (default: measured on this card and model family, "
        "scale/bench/measured.yaml; else 0.4)",
    )
    parser.add_argument(
        "--bandwidth",
        type=float,
        default=100.0,
        help="collective bandwidth per GPU inside a node, GB/s (NVLink: 100+) (default: %(default)s)",
    )
    parser.add_argument(
        "--inter-bandwidth",
        type=float,
        default=25.0,
        help="collective bandwidth per GPU across nodes, GB/s (InfiniBand / RoCE: 12-50) (default: %(default)s)",
    )


def register(sub) -> None:
    parser = sub.add_parser(
        "plan",
        help="judge the recipe as `scale submit` launches it (memory, step time), compare engines, propose a "
        "setting that fits",
        description="Judge the recipe as `scale submit` launches it, compare engines, propose a setting that fits. "
        + TRACE_NOTE,
    )
    parser.add_argument("recipe", help="recipe name or YAML path")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    parser.add_argument("--gpus", type=int, help="number of GPUs (ranks) on one node; or give --nodes")
    parser.add_argument("--nodes", type=int, help="number of nodes (with --gpus-per-node)")
    parser.add_argument("--gpus-per-node", type=int, help="GPUs (ranks) per node")
    add_gpu_arguments(parser)
    parser.set_defaults(func=cmd_plan)


def layout(args) -> tuple[int, int]:
    """(world, GPUs per node) from --gpus or --nodes/--gpus-per-node."""
    from scale.errors import UserError

    if args.nodes is not None or args.gpus_per_node is not None:
        if args.gpus is not None or args.nodes is None or args.gpus_per_node is None:
            raise UserError("give either --gpus N (one node) or both --nodes N and --gpus-per-node G")
        if args.nodes < 1 or args.gpus_per_node < 1:
            raise UserError(f"--nodes {args.nodes} and --gpus-per-node {args.gpus_per_node} must be >= 1")
        return args.nodes * args.gpus_per_node, args.gpus_per_node
    if args.gpus is None:
        raise UserError("give --gpus N (one node) or --nodes N --gpus-per-node G")
    return args.gpus, args.gpus


def gpu_model(args) -> tuple[float, str, str]:
    """(memory GiB, card name, where from) of the GPU planned for: --gpu-mem, --gpu, this machine's GPU, else
    DEFAULT_GPU."""
    if args.gpu:
        mem, name = GPUS[args.gpu]
        source = f"--gpu {args.gpu}"
    else:
        local = local_gpu()
        if local is not None:
            mem, name = local
            source = f"this machine's {name}"
        else:
            (mem, name), source = GPUS[DEFAULT_GPU], f"{DEFAULT_GPU} (default: no --gpu and no local GPU)"
    if args.gpu_mem is not None:
        return args.gpu_mem, name, f"--gpu-mem {args.gpu_mem:g}"
    return mem, name, source


def local_gpu() -> tuple[float, str] | None:
    """(memory GiB, name) of this machine's first GPU, or None. Asks torch only where a GPU driver is loaded: a
    login node without one answers without importing torch (scale submit --dry-run stays light)."""
    from pathlib import Path

    nvidia = Path("/proc/driver/nvidia/gpus")
    if not (nvidia.is_dir() and any(nvidia.iterdir())) and not Path("/dev/kfd").exists():  # NVIDIA, ROCm
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return props.total_memory / 2**30, props.name


@dataclass
class Judgement:
    """The recipe as submit launches it on a layout, predicted: what `scale plan` prints first and `scale submit`
    prints as its verdict."""

    trace: object  # scale.bench.steptrace.StepTrace
    cached: bool  # the trace came from the cache (scale.bench.trace_cache), not traced now
    setting: object  # scale.launch.layout.Setting
    own: object  # scale.bench.plan.Prediction of `setting`
    common: tuple  # the arguments plan() and predict() share after (trace, setting / per-GPU batch)
    per_gpu: int
    world: int
    gpus_per_node: int
    gpu_mem: float  # GiB
    gpu_source: str
    peak: float
    mfu: float  # hardware-FLOP fraction of the peak predict() uses
    mfu_note: str
    runs_as: str = ""  # the engine that runs, where the recipe's engine.kind runs as another (scale.engine.kinds)
    compile_hint: str | None = None  # an eager recipe: the compile mode measured faster on this card (measured.py)

    @property
    def fits(self) -> bool:
        from scale.bench.plan import HEADROOM

        return self.own.memory["total"] <= HEADROOM * self.gpu_mem * 2**30

    def verdict(self) -> str:
        from scale.bench.plan import HEADROOM

        limit = HEADROOM * self.gpu_mem
        used = self.own.memory["total"] / 2**30
        fits = "fits" if self.fits else "does NOT fit"
        return (
            f"as `scale submit` launches it: {self.setting.label()}{self.runs_as}: {used:.1f} GiB per GPU of {limit:.1f} GiB "
            f"({HEADROOM:.0%} of {self.gpu_mem:.1f}): {fits}; {self.own.step_s:.3f} s/step predicted "
            f"({'cached trace' if self.cached else 'traced'})"
        )


def judge(cfg, recipe: str, overrides: list[str], nodes: int, gpus_per_node: int, args) -> Judgement:
    """Predict the recipe's own setting (scale.launch.layout.launch_setting) on nodes x gpus_per_node GPUs."""
    from scale.config import load_recipe
    from scale.errors import UserError

    # the arguments are checked before the planner's imports (torch, timm): usage errors are quick
    world = nodes * gpus_per_node
    if world < 1 or cfg.train.global_batch % world:
        raise UserError(f"{world} GPUs must be >= 1 and divide train.global_batch {cfg.train.global_batch}")
    if (args.gpu_mem is not None and args.gpu_mem <= 0) or (args.mfu is not None and not 0 < args.mfu <= 1):
        raise UserError("--gpu-mem, --bandwidth and --inter-bandwidth must be positive and --mfu in (0, 1]")
    if args.bandwidth <= 0 or args.inter_bandwidth <= 0:
        raise UserError("--gpu-mem, --bandwidth and --inter-bandwidth must be positive and --mfu in (0, 1]")
    from scale.bench.measured import calibrate, compile_gain, family, load_rows
    from scale.bench.mfu import card_key, table_peak
    from scale.bench.plan import hardware_mfu, predict
    from scale.bench.trace_cache import cached_trace
    from scale.engine.kinds import describe, runs_as
    from scale.launch.layout import launch_setting

    gpu_mem, gpu_name, gpu_source = gpu_model(args)
    precision = cfg.engine.precision
    peak = args.gpu_tflops * 1e12 if args.gpu_tflops else table_peak(gpu_name, precision)
    peak = peak or table_peak("A100", precision)
    setting = launch_setting(cfg, overrides, nodes, gpus_per_node)
    trace, cached = cached_trace(cfg)  # the first call traces (torch, seconds); later ones read the cache
    per_gpu = cfg.train.global_batch // world
    hint = None
    if args.mfu is not None:
        mfu, note = args.mfu, f"MFU {args.mfu:.0%} (--mfu)"
    else:

        def family_of(name: str):
            return family(load_recipe(name))

        rows, card = load_rows(), card_key(gpu_name)
        cal = calibrate(rows, card, recipe, family(cfg), precision, setting.compile, family_of, per_gpu)
        mfu, note = hardware_mfu(trace, cal.mfu, cal.ac), cal.note
        if not setting.compile:
            hint = compile_gain(rows, card, recipe, precision, per_gpu)
    common = (world, gpu_mem * 2**30, precision, cfg.optim.name, peak, mfu, args.bandwidth * 1e9)
    own = predict(trace, setting, *common[:1], *common[2:], gpus_per_node, args.inter_bandwidth * 1e9)
    kind, shard_size = cfg.engine.kind, setting.shard_size or world
    ran = runs_as(kind, world, shard_size, cfg.engine.unsharded_ddp)
    why = f" (engine {describe(kind, ran, world)})" if ran != kind else ""
    return Judgement(
        trace, cached, setting, own, common, per_gpu, world, gpus_per_node, gpu_mem, gpu_source, peak, mfu, note, why,
        compile_hint=hint,
    )  # fmt: skip


def cmd_plan(args) -> int:
    from scale.config import load_recipe

    cfg = load_recipe(args.recipe, args.overrides)
    world, gpus_per_node = layout(args)
    j = judge(cfg, args.recipe, args.overrides, world // gpus_per_node, gpus_per_node, args)
    from scale.bench.plan import format_plan, plan

    inter = args.inter_bandwidth * 1e9
    table, best = plan(j.trace, j.per_gpu, *j.common, gpus_per_node, inter, recipe=j.setting)
    _, fastest = plan(j.trace, j.per_gpu, *j.common, gpus_per_node, inter)
    print(
        f"{args.recipe}: {j.trace.params / 1e6:.1f} M student parameters, {cfg.engine.precision}, {cfg.optim.name}, "
        f"GPU {j.gpu_source}: {j.gpu_mem:.1f} GiB, {j.peak / 1e12:.0f} TFLOP/s peak per GPU, "
        f"{args.bandwidth:.0f} GB/s inside a node, {args.inter_bandwidth:.0f} GB/s across nodes"
    )
    print(f"step time: {j.mfu_note}")
    print(j.verdict())
    print(format_plan(j.trace, table, best, world, j.gpu_mem * 2**30, j.per_gpu, gpus_per_node, recipe=j.setting))
    if best is not None and best.setting != j.setting:
        kept = best.setting.engine == j.setting.engine
        print(
            "  the recipe's engine with other checkpointing / accumulation: pass these overrides to `scale submit`"
            if kept
            else f"  the recipe's engine ({j.setting.name}) does not fit: pass these overrides to `scale submit`"
        )
    if best is not None and fastest is not None and fastest.setting.name != best.setting.name:
        print(
            f"  fastest predicted: {fastest.setting.label()} at {fastest.step_s:.3f} s/step; to run it, pass "
            f"{' '.join(fastest.setting.overrides())} to `scale submit`"
        )
    if j.compile_hint:
        print(f"  {j.compile_hint}")
    return 0
