"""scale train RECIPE [overrides] [--run-dir DIR] [--nproc N] [--synthetic-data]"""

from scale.commands import process_count


def register(sub) -> None:
    parser = sub.add_parser("train", help="train a recipe (continues an existing run directory)")
    parser.add_argument("recipe", help="recipe name (see `scale recipes list`) or YAML path")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    parser.add_argument("--run-dir", help="run directory (default runs/<recipe>)")
    parser.add_argument(
        "--nproc",
        type=process_count,
        default=0,
        help="spawn this many local processes (CPU: gloo); leave unset under torchrun or srun",
    )
    parser.add_argument(
        "--synthetic-data",
        action="store_true",
        help="random batches of the recipe's crop layout instead of its shards, no validation: a smoke run of a "
        "new cluster (engine, collectives, checkpoints) before the data is there",
    )
    parser.set_defaults(func=cmd_train)


def cmd_train(args) -> int:
    from scale.launch.local import already_launched, catch_early_signals

    if args.nproc > 1 and not already_launched():  # this process will launch the ranks
        catch_early_signals()
    from scale.config.load import recipe_path
    from scale.extras import import_timm

    recipe_path(args.recipe)  # a misspelt name fails here, before the loop's imports (torch)
    import_timm()  # before the loop imports it: without wandb
    from scale.loop.preemption import launcher_status
    from scale.loop.train import main

    return launcher_status(
        main(args.recipe, args.overrides, run_dir=args.run_dir, nproc=args.nproc, synthetic=args.synthetic_data)
    )
