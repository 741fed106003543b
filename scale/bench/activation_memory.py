"""`scale bench ac RECIPE`: activation memory per image and step time of each activation-checkpointing mode.

Activation memory per image is the slope of the step's peak memory (scale.bench.memory) from the smallest to the
largest batch, so that parameters, gradients and optimizer state, the same at every batch, do not hide it. Step time
is the median step at the largest batch, in wall-clock seconds and in the process's CPU seconds (on a loaded
machine the better measure of what the step costs: run with OMP_NUM_THREADS=1 so that no thread spins waiting for
another). The settings are interleaved (every mode and batch once per round) and the
rounds repeated, and each number is the median over rounds, so that a slow spell of a shared machine moves one
sample of every setting rather than every sample of one.
"""

import argparse
import gc
import json
import os
import statistics

MODES = ("none", "selective", "full", "every2")


def measure(recipe: str, overrides: list[str], modes, batches, rounds: int, steps: int, warmup: int) -> dict:
    """{(mode, batch): [bench_config results, one per round]}."""
    from scale.bench.matrix import load_setting  # torch: not when `scale bench ac --help` builds the parser
    from scale.bench.run import bench_config
    from scale.engine.dist import init_distributed

    info, device = init_distributed()
    configs = {
        (mode, batch): load_setting(recipe, overrides, {"ac": mode, "batch": str(batch)}, info.world_size)
        for mode in modes
        for batch in batches
    }  # every setting checked before the first is measured
    runs: dict = {key: [] for key in configs}
    for _ in range(rounds):
        for key, cfg in configs.items():
            runs[key].append(bench_config(cfg, info, device, steps, warmup, synthetic=True, count_flops=False))
            gc.collect()
    return runs


def table(runs: dict, modes, batches) -> list[dict]:
    small, large = min(batches), max(batches)
    rows = []
    for mode in modes:
        peaks = {b: statistics.median(r["peak_bytes"] for r in runs[(mode, b)]) for b in batches}
        rows.append(
            {
                "mode": mode,
                "peak_bytes": peaks,
                "per_image_bytes": (peaks[large] - peaks[small]) / (large - small),
                "step_s": statistics.median(r["step_s_median"] for r in runs[(mode, large)]),
                "step_s_rounds": [r["step_s_median"] for r in runs[(mode, large)]],
                "step_cpu_s": statistics.median(r["step_cpu_s_median"] for r in runs[(mode, large)]),
                "step_cpu_s_rounds": [r["step_cpu_s_median"] for r in runs[(mode, large)]],
            }
        )
    return rows


def format_rows(rows: list[dict], batches) -> str:
    base = rows[0]
    small, large = min(batches), max(batches)
    lines = [
        f"| setting | peak MiB, batch {small} / {large} | per image | {base['mode']} / this "
        f"| step s, batch {large} | this / {base['mode']} | step CPU s | this / {base['mode']} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        peaks = " / ".join(f"{row['peak_bytes'][b] / 2**20:.0f}" for b in (small, large))
        lines.append(
            f"| {row['mode']} | {peaks} | {row['per_image_bytes'] / 2**20:.0f} MiB "
            f"| {base['per_image_bytes'] / row['per_image_bytes']:.2f}x | {row['step_s']:.2f} "
            f"| {row['step_s'] / base['step_s']:.2f}x | {row['step_cpu_s']:.2f} "
            f"| {row['step_cpu_s'] / base['step_cpu_s']:.2f}x |"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """`scale bench ac`'s options (also read by the documentation's command reference)."""
    parser = argparse.ArgumentParser(prog="scale bench ac", description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    parser.add_argument(
        "--modes", default=",".join(MODES), help="none, selective, full, every<N>; the first is the base"
    )
    parser.add_argument(
        "--batches", default="1,2", help="global batches; the slope runs from the smallest to the largest"
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds over every setting")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per setting and round")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before the timed ones")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_intermixed_args(argv)
    from scale.config import load_recipe  # after parsing: `--help` and usage errors import no torch
    from scale.engine.dist import shutdown
    from scale.errors import UserError

    load_recipe(args.recipe, args.overrides)
    modes = [m for m in args.modes.split(",") if m]
    batches = sorted({int(b) for b in args.batches.split(",") if b})
    if len(batches) < 2 or args.rounds < 1:
        raise UserError(f"scale bench ac: give at least two --batches (got {args.batches}) and --rounds >= 1")
    load = os.getloadavg()[0]
    try:
        runs = measure(args.recipe, args.overrides, modes, batches, args.rounds, args.steps, args.warmup)
    finally:
        shutdown()
    rows = table(runs, modes, batches)
    print(
        f"{args.recipe} {' '.join(args.overrides)}: synthetic data, {args.rounds} interleaved round(s) of "
        f"{args.steps} timed step(s) after {args.warmup} warm-up and 1 profiled step; medians over rounds; "
        f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPU(s)"
    )
    print(format_rows(rows, batches))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0
