"""scale demo [--method dino|esvit|mocov3|drloc] [--run-dir DIR] [--steps N] [--no-bench] [--tracker NAME]..."""

from scale.commands import process_count


def register(sub) -> None:
    parser = sub.add_parser("demo", help="the whole story on a laptop: shards, k-NN, training, resume, report")
    parser.add_argument("--method", default="dino", help="dino | esvit | mocov3 | drloc")
    parser.add_argument("--run-dir", default="runs/demo", help="where shards, runs and the report go")
    parser.add_argument("--steps", type=int, help="train this many steps instead of the recipe's epochs")
    parser.add_argument("--nproc", type=process_count, default=2, help="CPU processes (gloo)")
    parser.add_argument("--no-bench", dest="bench", action="store_false", help="skip the engine benchmark (step 5)")
    parser.add_argument(
        "--tracker",
        dest="trackers",
        action="append",
        default=[],
        help="also log to wandb or mlflow (repeatable; docs/how-to/trackers.md); offline with WANDB_MODE=offline",
    )
    parser.set_defaults(func=cmd_demo)


def cmd_demo(args) -> int:
    from scale.extras import require

    for module in ("sklearn", "skimage", "matplotlib"):  # before any work; the demo extra brings all three
        require("demo", module, "scale demo")
    from scale.demo import run_demo

    run_demo(args.method, args.run_dir, args.steps, args.nproc, args.bench, args.trackers)
    return 0
