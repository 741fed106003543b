"""scale plan RECIPE [overrides] (--gpus N | --nodes N --gpus-per-node G) --gpu-mem GB [--gpu-tflops T]: per-GPU
memory, the bytes each GPU sends per step inside its node and across nodes, and step time of each engine setting
(DDP, FSDP2, HSDP, ZeRO-1/2/3), and a setting (engine, checkpointing, micro-batch, accumulation) that fits."""


def register(sub) -> None:
    parser = sub.add_parser(
        "plan", help="predict per-GPU memory, network bytes and step time per engine; propose a setting that fits"
    )
    parser.add_argument("recipe", help="recipe name or YAML path")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    parser.add_argument("--gpus", type=int, help="number of GPUs (ranks) on one node; or give --nodes")
    parser.add_argument("--nodes", type=int, help="number of nodes (with --gpus-per-node)")
    parser.add_argument("--gpus-per-node", type=int, help="GPUs (ranks) per node")
    parser.add_argument("--gpu-mem", type=float, required=True, help="memory per GPU, GB (GiB)")
    parser.add_argument(
        "--gpu-tflops", type=float, help="peak TFLOP/s of one GPU in the recipe's precision (default: an A100's)"
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


def cmd_plan(args) -> int:
    from scale.bench.flops import table_peak
    from scale.bench.plan import format_plan, plan
    from scale.bench.trace import trace_step
    from scale.config import load_recipe
    from scale.errors import UserError

    cfg = load_recipe(args.recipe, args.overrides)
    world, gpus_per_node = layout(args)
    if world < 1 or cfg.train.global_batch % world:
        raise UserError(f"{world} GPUs must be >= 1 and divide train.global_batch {cfg.train.global_batch}")
    if args.gpu_mem <= 0 or not 0 < args.mfu <= 1 or args.bandwidth <= 0 or args.inter_bandwidth <= 0:
        raise UserError("--gpu-mem, --bandwidth and --inter-bandwidth must be positive and --mfu in (0, 1]")
    precision = cfg.engine.precision
    peak = args.gpu_tflops * 1e12 if args.gpu_tflops else table_peak("A100", precision)
    per_gpu = cfg.train.global_batch // world
    trace = trace_step(cfg)
    table, best = plan(
        trace,
        per_gpu,
        world,
        args.gpu_mem * 2**30,
        precision,
        cfg.optim.name,
        peak,
        args.mfu,
        args.bandwidth * 1e9,
        gpus_per_node,
        args.inter_bandwidth * 1e9,
    )
    print(
        f"{args.recipe}: {trace.params / 1e6:.1f} M student parameters, {precision}, {cfg.optim.name}, "
        f"{peak / 1e12:.0f} TFLOP/s peak per GPU at {args.mfu:.0%} MFU, {args.bandwidth:.0f} GB/s inside a node, "
        f"{args.inter_bandwidth:.0f} GB/s across nodes"
    )
    print(format_plan(trace, table, best, world, args.gpu_mem * 2**30, per_gpu, gpus_per_node))
    return 0
