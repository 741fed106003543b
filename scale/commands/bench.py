"""scale bench: throughput benchmarks.

- `scale bench RECIPE [overrides] [--steps N] [--warmup W] [--synthetic-data] [--matrix key=v1,v2]... [--json F]
  [--nproc N]`: real training steps (scale.bench.run), one table row per setting of the matrix (one axis per
  `--matrix`, or several short-key axes after one flag; a dotted override after it is an override, never an axis);
- `scale bench data RECIPE [--workers N] [--images N] [--shards DIR | --photos] [--rate N]` measures the view
  pipelines side by side (scale.data.throughput);
- `scale bench host RECIPE [overrides] [--steps N] [--json F]`: the host's share of one step by phase (scale.bench.host);
- `scale bench table dino8|esvit9|mocov3-3 [--scale tiny|full] ...`: the papers' cost tables.
The first word selects a benchmark from `BENCHES`; any other first word is a recipe.
"""

import argparse
import json

from scale.commands import process_count


def _data_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scale bench data",
        description="images/s of the view pipelines (official DINO, scale's CPU views, the split pipeline's CPU and "
        "device parts) in one run, and of the DALI backend when installed",
    )
    parser.add_argument("recipe", help="recipe name or YAML path (its data.views and data.train are used)")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    parser.add_argument("--workers", type=int, default=1, help="processes, for every CPU pipeline")
    parser.add_argument("--images", type=int, default=200, help="images read from the shards")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--shards", help="shard directory (default: the recipe's data.train)")
    source.add_argument(
        "--photos", action="store_true", help="generated 500x375 JPEG shards (embedded photos_large), made here"
    )
    parser.add_argument("--rate", type=float, default=2500, help="N: cores per GPU needed to feed N images/s")
    parser.add_argument("--dali-device", default="auto", help="DALI backend: auto | gpu | cpu")
    return parser


# Every benchmark parses its arguments before importing its module: `--help` and usage errors import no torch.


def bench_data(argv: list[str]) -> int:
    args = _data_parser().parse_intermixed_args(argv)
    import tempfile

    from scale.config import load_recipe

    cfg = load_recipe(args.recipe, args.overrides)
    with tempfile.TemporaryDirectory(prefix="scale-bench-data-") as tmp:
        if args.photos:
            from scale.data import embedded

            shards = str(embedded.build("photos_large", tmp)["train"])
        else:
            shards = args.shards or cfg.data.train
        for line in data_table(cfg.data.views, shards, args):
            print(line)
    return 0


def data_table(views_cfg, shards: str, args) -> list[str]:
    """The rows of `scale bench data`: per pipeline images/s, images/s per core and cores per GPU at --rate."""
    import os

    from scale.data.throughput import PIPELINES, bench_dali, bench_device, bench_views, dali_available

    result = bench_views(views_cfg, shards, workers=args.workers, images=args.images)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"{result['images']} images from {shards}, {result['workers']} worker process(es); load average {load}",
        f"  {'pipeline':38s} {'images/s':>9s} {'per core':>9s} {'x official':>10s} {f'cores @ {args.rate:g}/s':>14s}",
    ]
    official = result["reference"]["per_core"]
    for name, label in PIPELINES.items():
        r = result[name]
        lines.append(
            f"  {label:38s} {r['images_per_s']:9.1f} {r['per_core']:9.1f} {r['per_core'] / official:9.2f}x "
            f"{args.rate / r['per_core']:14.1f}"
        )
    device = bench_device(views_cfg)
    lines.append(
        f"  {'photometric_on=device: device part':38s} {device['images_per_s']:9.1f} "
        f"(batches of {device['batch']} images on {device['device']})"
    )
    if not dali_available():
        lines.append("  dali: not installed (pip install 'scale[dali]')")
        return lines
    dali = bench_dali(views_cfg, shards, workers=args.workers, images=args.images, device=args.dali_device)
    lines.append(
        f"  {'dali/' + dali['device']:38s} {dali['images_per_s']:9.1f} ({dali['images']} images, "
        f"{args.workers} thread(s), {dali['cpu_s']:.1f} CPU seconds)"
    )
    return lines


def _train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scale bench", description="images/s, step-time phases, memory and MFU of real training steps"
    )
    parser.add_argument("recipe", help="recipe name or YAML path")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per setting")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    parser.add_argument(
        "--synthetic-data", action="store_true", help="random batches of the recipe's crop layout instead of its shards"
    )
    parser.add_argument(
        "--matrix",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="compare settings, one axis per flag (--matrix engine=ddp,fsdp2 --matrix ac=none,full) or, for the "
        "short keys, several after one flag (--matrix engine=ddp,fsdp2 ac=none,full); rows are their product. Keys: "
        "engine, precision, ac, compile, micro_batch, crops, batch or a dotted recipe key",
    )
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--nproc", type=process_count, default=0, help="spawn this many local processes (CPU: gloo)")
    return parser


def without_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item == "--nproc":
            skip = True
        elif not item.startswith("--nproc="):
            out.append(item)
    return out


def bench_train(argv: list[str]) -> int:
    args = _train_parser().parse_intermixed_args(argv)
    from scale.bench.matrix import format_table, run_matrix, split_axes
    from scale.config import load_recipe
    from scale.launch.local import already_launched, spawn

    args.overrides, axes = split_axes(args.overrides)
    args.matrix += axes
    load_recipe(args.recipe, args.overrides)  # validate before spawning anything
    if args.nproc > 1 and not already_launched():
        return spawn(args.nproc, ["bench", *without_nproc(argv)])
    from scale.engine.dist import detect, shutdown

    try:
        rows = run_matrix(args.recipe, args.overrides, args.matrix, args.steps, args.warmup, args.synthetic_data)
    finally:
        shutdown()
    if detect().is_main:
        print(
            f"{args.recipe}: {args.steps} timed steps after {args.warmup} warm-up and 1 profiled step, "
            f"{rows[0]['world']} rank(s), {'synthetic' if args.synthetic_data else 'shard'} data; phases in s/step"
        )
        print(format_table(rows))
        print(
            f"MFU against {rows[0].get('peak_source', '-')}; memory: peak tensor bytes (CUDA max allocated or "
            f"CPU tracked allocations), state = params + grads + optimizer + teacher per rank"
        )
        if args.json:
            with open(args.json, "w") as out:
                json.dump(rows, out, indent=1)
    return 0


TABLE_NAMES = ("dino8", "esvit9", "mocov3-3")  # scale.bench.tables.TABLES


def table_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scale bench table", description="the papers' cost tables, measured here")
    parser.add_argument("table", choices=sorted(TABLE_NAMES))
    parser.add_argument("overrides", nargs="*", help="section.key=value, applied to every row's recipe")
    parser.add_argument(
        "--scale",
        default="tiny",
        choices=("tiny", "full"),
        help="full: the recipes' real models (a GPU, or small batches on a CPU); tiny: the same rows on tiny models",
    )
    parser.add_argument(
        "--batch",
        type=int,
        help="global batch of every row (default: the recipe's at full scale; at tiny scale kept when <= 16, else 4)",
    )
    parser.add_argument("--steps", type=int, default=2, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    parser.add_argument(
        "--rows", nargs="+", help="esvit9: only rows whose name ends with one of these, e.g. 'Swin-T bs8'"
    )
    parser.add_argument("--devices", type=int, help="mocov3-3: devices to extrapolate to (default: the paper's)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    return parser


def bench_table(argv: list[str]) -> int:
    args = table_parser().parse_intermixed_args(argv)
    from scale.bench.tables import run

    return run(args)


def bench_ac(argv: list[str]) -> int:
    from scale.bench.activation_memory import main

    return main(argv)


def _ckpt_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scale bench ckpt", description="checkpoint size, save time and training stall: sync vs async"
    )
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    parser.add_argument("--steps", type=int, default=12, help="training steps per run")
    parser.add_argument("--every", type=int, default=3, help="checkpoint every this many steps")
    parser.add_argument("--nproc", type=process_count, default=2, help="local processes (CPU: gloo)")
    return parser


def bench_ckpt(argv: list[str]) -> int:
    args = _ckpt_parser().parse_intermixed_args(argv)
    from scale.bench.checkpoint import measure, table

    print(table(measure(args.recipe, args.overrides, args.steps, args.every, args.nproc)))
    return 0


def host_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scale bench host",
        description="per phase of one training step: ops dispatched, ops that launch device work, copies, dtype "
        "casts, DTensor dispatches, host syncs, and host ms per step (one process, synthetic batches)",
    )
    parser.add_argument("recipe", help="recipe name or YAML path")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the counted one")
    parser.add_argument("--warmup", type=int, default=1, help="untimed, uncounted steps before them")
    parser.add_argument("--json", help="also write the result to this JSON file")
    return parser


def bench_host(argv: list[str]) -> int:
    args = host_parser().parse_intermixed_args(argv)
    from scale.bench.host import format_budget, host_budget
    from scale.config import load_recipe
    from scale.engine.dist import shutdown
    from scale.engine.parallel import init_parallel

    cfg = load_recipe(args.recipe, args.overrides)
    info, device = init_parallel()
    try:
        result = host_budget(cfg, info, device, steps=args.steps, warmup=args.warmup)
    finally:
        shutdown()
    print(
        f"{args.recipe}: engine {result['engine']}, {result['precision']}, {device}, batch "
        f"{cfg.train.global_batch}; counts of step {args.warmup}, host ms: mean of {args.steps} steps"
    )
    print(format_budget(result))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"recipe": args.recipe, "overrides": args.overrides, **result}, out, indent=1)
    return 0


BENCHES = {"data": bench_data, "table": bench_table, "ckpt": bench_ckpt, "ac": bench_ac, "host": bench_host}


def _ac_parser() -> argparse.ArgumentParser:
    from scale.bench.activation_memory import parser

    return parser()


# each benchmark's own parser (the command reference lists their options; "RECIPE": `scale bench RECIPE`)
PARSERS = {
    "RECIPE": _train_parser,
    "data": _data_parser,
    "table": table_parser,
    "ckpt": _ckpt_parser,
    "ac": _ac_parser,
    "host": host_parser,
}


def _options_sentence(parser: argparse.ArgumentParser, usage: str) -> str:
    """A parser's options as one sentence of prose, for an epilog that the help formatter may re-wrap."""
    options = []
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or "-h" in action.option_strings:
            continue
        metavar = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
        default = "" if action.default in (None, False, []) else f", default {action.default}"
        options.append(f"{action.option_strings[-1]}{metavar} ({action.help}{default})")
    return f"`{usage}` takes: " + "; ".join(options) + "."


def register(sub) -> None:
    parser = sub.add_parser(
        "bench",
        help="throughput benchmarks: `scale bench RECIPE` (training steps), "
        "`scale bench data RECIPE`, `scale bench table NAME`, `scale bench ac RECIPE`, `scale bench host RECIPE`",
        # the recipe benchmark's own options, which `target`'s REMAINDER would otherwise hide (issue 48 item 9)
        epilog=_options_sentence(_train_parser(), "scale bench RECIPE [overrides]")
        + f" The other benchmarks ({', '.join(BENCHES)}): `scale bench NAME --help` lists each one's options.",
    )
    parser.add_argument("target", help=f"a recipe, or one of: {', '.join(BENCHES)}")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of that benchmark")
    parser.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    if args.target in BENCHES:
        return BENCHES[args.target](args.args)
    return bench_train([args.target, *args.args])
