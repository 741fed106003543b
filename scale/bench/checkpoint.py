"""`scale bench ckpt`: checkpoint size, time to disk, and the training stall of synchronous vs asynchronous saves,
measured on real `scale train` runs that checkpoint every few steps."""

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from scale.errors import UserError
from scale.readback import read_metrics


def _run(recipe: str, overrides: list[str], run_dir: Path, nproc: int) -> None:
    cmd = [sys.executable, "-m", "scale.cli", "train", recipe, *overrides, "--run-dir", str(run_dir)]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    out = subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True)
    if out.returncode != 0:
        raise UserError(f"scale train failed ({out.returncode}): {out.stderr[-2000:]}")


def measure(recipe: str, overrides: list[str], steps: int, every: int, nproc: int) -> list[dict]:
    rows = []
    for mode in ("sync", "async"):
        with tempfile.TemporaryDirectory(prefix="scale-bench-ckpt-") as tmp:
            run_dir = Path(tmp) / mode
            settings = [
                f"train.max_steps={steps}",
                f"train.ckpt_every_steps={every}",
                "train.log_every=1",
                f"train.async_save={'true' if mode == 'async' else 'false'}",
                f"train.keep_last={steps}",
            ]
            _run(recipe, list(overrides) + settings, run_dir, nproc)
            saves = [json.loads(line) for line in (run_dir / "checkpoints" / "saves.jsonl").read_text().splitlines()]
            steps_s = [m["step_time_s"] for m in read_metrics(run_dir / "metrics.jsonl") if "step_time_s" in m]
        rows.append(
            {
                "mode": mode,
                "checkpoints": len(saves),
                "mib": statistics.median(s["bytes"] for s in saves) / 2**20,
                "save_s": statistics.median(s["save_s"] for s in saves),
                "stall_s": statistics.median(s["stall_s"] for s in saves),
                "step_s": statistics.median(steps_s),
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'mode':<6} {'ckpts':>5} {'size MiB':>9} {'save s':>8} {'stall s':>8} {'step s':>8}"]
    lines += [
        f"{r['mode']:<6} {r['checkpoints']:>5} {r['mib']:>9.1f} {r['save_s']:>8.3f} {r['stall_s']:>8.3f} "
        f"{r['step_s']:>8.3f}"
        for r in rows
    ]
    return "\n".join(lines)
