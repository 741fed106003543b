"""scale plan RECIPE [overrides] (--gpus N | --nodes N --gpus-per-node G) [--gpu NAME | --gpu-mem GB]
[--gpu-tflops T]: per-GPU memory, the bytes each GPU sends per step inside its node and across nodes, and step time
of each engine setting (DDP, FSDP2, HSDP, ZeRO-1/2/3), and a setting (engine, checkpointing, micro-batch,
accumulation) that fits. The proposal keeps the recipe's engine laid out as `scale submit` lays it out
(scale.engine.kinds.recipe_setting), so that both give one answer; it changes the engine only when none fits."""

from scale.bench.gpus import DEFAULT_GPU, GPUS


def register(sub) -> None:
    parser = sub.add_parser(
        "plan", help="predict per-GPU memory, network bytes and step time per engine; propose a setting that fits"
    )
    parser.add_argument("recipe", help="recipe name or YAML path")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    parser.add_argument("--gpus", type=int, help="number of GPUs (ranks) on one node; or give --nodes")
    parser.add_argument("--nodes", type=int, help="number of nodes (with --gpus-per-node)")
    parser.add_argument("--gpus-per-node", type=int, help="GPUs (ranks) per node")
    parser.add_argument(
        "--gpu",
        choices=sorted(GPUS),
        metavar="MODEL",
        help=f"GPU model: its memory and peak ({', '.join(sorted(GPUS))}); default: this machine's GPU, "
        f"else {DEFAULT_GPU}",
    )
    parser.add_argument("--gpu-mem", type=float, help="memory per GPU, GB (GiB); overrides --gpu's")
    parser.add_argument(
        "--gpu-tflops", type=float, help="peak TFLOP/s of one GPU in the recipe's precision (default: the GPU's)"
    )
    parser.add_argument("--mfu", type=float, default=0.4, help="fraction of the peak a step achieves")
    parser.add_argument(
        "--bandwidth",
        type=float,
        default=100.0,
        help="collective bandwidth per GPU inside a node, GB/s (NVLink: 100+)",
    )
    parser.add_argument(
        "--inter-bandwidth",
        type=float,
        default=25.0,
        help="collective bandwidth per GPU across nodes, GB/s (InfiniBand / RoCE: 12-50)",
    )
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
    """(memory GiB, peak-table name, where from) of the GPU planned for: --gpu-mem, --gpu, this machine's GPU,
    else DEFAULT_GPU."""
    if args.gpu:
        mem, name = GPUS[args.gpu]
        source = f"--gpu {args.gpu}"
    else:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            mem, name, source = props.total_memory / 2**30, props.name, f"this machine's {props.name}"
        else:
            (mem, name), source = GPUS[DEFAULT_GPU], f"{DEFAULT_GPU} (default: no --gpu and no local GPU)"
    if args.gpu_mem is not None:
        return args.gpu_mem, name, f"--gpu-mem {args.gpu_mem:g}"
    return mem, name, source


def cmd_plan(args) -> int:
    from scale.config import load_recipe
    from scale.errors import UserError

    # the arguments and the recipe are checked before the planner's imports (torch, timm): usage errors are quick
    world, gpus_per_node = layout(args)
    if (args.gpu_mem is not None and args.gpu_mem <= 0) or not 0 < args.mfu <= 1:
        raise UserError("--gpu-mem, --bandwidth and --inter-bandwidth must be positive and --mfu in (0, 1]")
    if args.bandwidth <= 0 or args.inter_bandwidth <= 0:
        raise UserError("--gpu-mem, --bandwidth and --inter-bandwidth must be positive and --mfu in (0, 1]")
    cfg = load_recipe(args.recipe, args.overrides)
    if world < 1 or cfg.train.global_batch % world:
        raise UserError(f"{world} GPUs must be >= 1 and divide train.global_batch {cfg.train.global_batch}")
    from scale.bench.flops import table_peak
    from scale.bench.plan import format_plan, plan
    from scale.bench.trace import trace_step
    from scale.engine.kinds import recipe_setting

    gpu_mem, gpu_name, gpu_source = gpu_model(args)
    precision = cfg.engine.precision
    peak = (
        args.gpu_tflops * 1e12 if args.gpu_tflops else table_peak(gpu_name, precision) or table_peak("A100", precision)
    )
    per_gpu = cfg.train.global_batch // world
    trace = trace_step(cfg)
    # the recipe's engine as `scale submit` lays it out on these nodes: the planner proposes what submit runs
    own = recipe_setting(
        cfg.engine.kind, cfg.engine.zero_stage, cfg.engine.shard_size, world // gpus_per_node, gpus_per_node
    )
    common = (world, gpu_mem * 2**30, precision, cfg.optim.name, peak, args.mfu, args.bandwidth * 1e9)
    table, best = plan(trace, per_gpu, *common, gpus_per_node, args.inter_bandwidth * 1e9, recipe=own)
    _, fastest = plan(trace, per_gpu, *common, gpus_per_node, args.inter_bandwidth * 1e9)
    print(
        f"{args.recipe}: {trace.params / 1e6:.1f} M student parameters, {precision}, {cfg.optim.name}, "
        f"GPU {gpu_source}: {gpu_mem:.1f} GiB, "
        f"{peak / 1e12:.0f} TFLOP/s peak per GPU at {args.mfu:.0%} MFU, {args.bandwidth:.0f} GB/s inside a node, "
        f"{args.inter_bandwidth:.0f} GB/s across nodes"
    )
    print(format_plan(trace, table, best, world, gpu_mem * 2**30, per_gpu, gpus_per_node))
    if best is not None:
        recipe_engine = f"engine.kind={cfg.engine.kind}" + (f", shard size {own[1]}" if own[1] else "")
        kept = best.setting.name.split("/")[0] == own[0]
        print(
            f"  the recipe's engine ({recipe_engine}), as `scale submit` lays it out"
            if kept
            else f"  the recipe's engine ({own[0]}) does not fit: pass these overrides to `scale submit` too"
        )
    if best is not None and fastest is not None and fastest.setting.name != best.setting.name:
        print(
            f"  fastest predicted: {fastest.setting.label()} at {fastest.step_s:.3f} s/step; to run it, pass "
            f"{' '.join(fastest.setting.overrides())} to `scale submit`"
        )
    return 0
