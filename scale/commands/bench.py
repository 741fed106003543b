"""scale bench TARGET ...: `scale bench data RECIPE [--workers N] [--images N]` measures the data pipeline.

The first word selects what is measured, so that training throughput (`scale bench RECIPE ...`) can be routed from
`BENCHES` in this module too.
"""

import argparse

from scale.errors import UserError


def _data_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scale bench data",
                                     description="images/s and crops/s of the view pipeline vs official DINO's")
    parser.add_argument("recipe", help="recipe name or YAML path (its data.views and data.train are used)")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    parser.add_argument("--workers", type=int, default=1, help="processes, for both pipelines")
    parser.add_argument("--images", type=int, default=200, help="images read from the shards")
    parser.add_argument("--shards", help="shard directory (default: the recipe's data.train)")
    return parser


def bench_data(argv: list[str]) -> int:
    from scale.config import load_recipe
    from scale.data.bench import bench_views

    args = _data_parser().parse_args(argv)
    cfg = load_recipe(args.recipe, args.overrides)
    result = bench_views(cfg.data.views, args.shards or cfg.data.train, workers=args.workers, images=args.images)
    print(f"{result['images']} images, {result['workers']} worker(s)")
    print(f"  ours      {result['ours_images_per_s']:8.1f} images/s {result['ours_crops_per_s']:9.1f} crops/s")
    print(f"  reference {result['reference_images_per_s']:8.1f} images/s "
          f"{result['reference_crops_per_s']:9.1f} crops/s (official DINO: PIL, full decode, 2x224 + 10x96)")
    print(f"  speedup   {result['speedup']:8.2f}x images/s on the same cores (wall clock)")
    print(f"            {result['speedup_per_core']:8.2f}x per core (CPU seconds: ours {result['ours_cpu_s']:.1f}, "
          f"reference {result['reference_cpu_s']:.1f})")
    return 0


BENCHES = {"data": bench_data}


def register(sub) -> None:
    parser = sub.add_parser("bench", help="throughput benchmarks: `scale bench data RECIPE` for the data pipeline")
    parser.add_argument("target", help=f"what to measure: {', '.join(BENCHES)}")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of that benchmark")
    parser.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    if args.target not in BENCHES:
        raise UserError(f"unknown benchmark '{args.target}' (choose from {', '.join(BENCHES)})")
    return BENCHES[args.target](args.args)
