"""scale plan RECIPE [overrides] --gpus N --gpu-mem GB [--gpu-tflops T]: per-GPU memory and step time of each
engine, and a setting (engine, checkpointing, micro-batch, accumulation) that fits."""


def register(sub) -> None:
    parser = sub.add_parser("plan", help="predict per-GPU memory and step time; propose a setting that fits")
    parser.add_argument("recipe", help="recipe name or YAML path")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    parser.add_argument("--gpus", type=int, required=True, help="number of GPUs (ranks)")
    parser.add_argument("--gpu-mem", type=float, required=True, help="memory per GPU, GB (GiB)")
    parser.add_argument(
        "--gpu-tflops", type=float, help="peak TFLOP/s of one GPU in the recipe's precision (default: an A100's)"
    )
    parser.add_argument("--mfu", type=float, default=0.4, help="fraction of the peak a step achieves")
    parser.add_argument(
        "--bandwidth",
        type=float,
        default=50.0,
        help="collective bandwidth per GPU, GB/s (NVLink in a node: 100+, InfiniBand: 12-50)",
    )
    parser.set_defaults(func=cmd_plan)


def cmd_plan(args) -> int:
    from scale.bench.flops import table_peak
    from scale.bench.plan import format_plan, plan
    from scale.bench.trace import trace_step
    from scale.config import load_recipe
    from scale.errors import UserError

    cfg = load_recipe(args.recipe, args.overrides)
    if args.gpus < 1 or cfg.train.global_batch % args.gpus:
        raise UserError(f"--gpus {args.gpus} must be >= 1 and divide train.global_batch {cfg.train.global_batch}")
    if args.gpu_mem <= 0 or not 0 < args.mfu <= 1 or args.bandwidth <= 0:
        raise UserError("--gpu-mem and --bandwidth must be positive and --mfu in (0, 1]")
    precision = cfg.engine.precision
    peak = args.gpu_tflops * 1e12 if args.gpu_tflops else table_peak("A100", precision)
    per_gpu = cfg.train.global_batch // args.gpus
    trace = trace_step(cfg)
    table, best = plan(
        trace, per_gpu, args.gpus, args.gpu_mem * 2**30, precision, cfg.optim.name, peak, args.mfu, args.bandwidth * 1e9
    )
    print(
        f"{args.recipe}: {trace.params / 1e6:.1f} M student parameters, {precision}, {cfg.optim.name}, "
        f"{peak / 1e12:.0f} TFLOP/s peak per GPU at {args.mfu:.0%} MFU, {args.bandwidth:.0f} GB/s"
    )
    print(format_plan(trace, table, best, args.gpus, args.gpu_mem * 2**30, per_gpu))
    return 0
