"""Run reports: a markdown table of the paper's numbers next to ours, and PNG plots of loss, k-NN accuracy,
validation accuracy and throughput, all read from run directories (config.yaml, metrics.jsonl, eval/*.json)."""

import shutil
import statistics
from pathlib import Path

from scale.extras import require

require("viz", "matplotlib", "the report's plots").use("Agg")  # files only: runs on headless nodes
import matplotlib.pyplot as plt  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from scale.config.load import from_dict  # noqa: E402
from scale.errors import UserError  # noqa: E402
from scale.loop.rundir import RunDir  # noqa: E402
from scale.readback import EVAL_RESULT, read_json, read_metrics  # noqa: E402

PLOTS = {  # file stem -> (metrics side by side, y labels, title)
    # DINO's collapse and its teacher-temperature warm-up read from the teacher's entropy and the student/teacher KL
    "loss": (
        ("loss", "teacher_entropy", "teacher_student_kl"),
        ("training loss", "teacher entropy", "student/teacher KL"),
        "Training loss",
    ),
    "knn": (("knn_monitor_top1",), ("k-NN monitor top-1 (%)",), "k-NN monitor during training (training features)"),
    "probe": (("probe_top1",), ("online probe top-1 (%)",), "Online linear probe on the training batches"),
    "val": (("val_top1",), ("validation top-1 (%)",), "Validation top-1"),
    "throughput": (("images_per_s",), ("images/s (as defined above)",), "Training throughput"),
}
SMOOTHED = {"probe_top1": 10}  # one batch per point is noise: a moving average over this many points beside it
# the one definition of the report's images/s; every other images/s figure says how it differs
IMAGES_PER_S = (
    "**images/s**: the global batch (all ranks) divided by the time of one training step's forward, backward and "
    "optimizer update on rank 0, data loading and monitors excluded, as metrics.jsonl logs it per step."
)


def load_run(path: str | Path) -> dict:
    run = RunDir(path)
    if not run.config.exists():
        raise UserError(f"{path}: not a run directory (no config.yaml)")
    evals = {}
    for file in sorted((run.root / "eval").glob("*.json")) if (run.root / "eval").is_dir() else []:
        evals[file.stem] = read_json(file, EVAL_RESULT)
    return {
        "root": run.root,
        "config": from_dict(run.read_config(), str(run.config)),
        "metrics": read_metrics(run.metrics),
        "evals": evals,
    }


def moving_average(values: list[float], window: int) -> list[float]:
    """The mean of each value and the up to `window - 1` before it."""
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def plot_series(runs: list[dict], keys, ylabels, out: Path, title: str = "") -> Path | None:
    """One panel per metric of `keys` that a run logged, side by side, one line per run against the step; each
    resume (`resumed_at` in metrics.jsonl) marked on the loss panel; a SMOOTHED metric with its moving average.
    None when no run logged any of them."""
    logged = [
        (k, y)
        for k, y in zip(keys, ylabels)
        if any(isinstance(m.get(k), (int, float)) for r in runs for m in r["metrics"])
    ]
    if not logged:
        return None
    fig, axes = plt.subplots(1, len(logged), figsize=(6 * len(logged), 3.5), squeeze=False)
    for ax, (key, ylabel) in zip(axes[0], logged):
        for run in runs:
            points = [(m["step"], m[key]) for m in run["metrics"] if isinstance(m.get(key), (int, float))]
            if not points:
                continue
            steps, values = zip(*points)
            name = run["config"].meta.name
            window = SMOOTHED.get(key)
            if window:
                ax.plot(steps, values, alpha=0.3, label=f"{name} (each batch)")
                ax.plot(steps, moving_average(list(values), window), label=f"{name} (mean of {window} points)")
            else:
                ax.plot(steps, values, marker="o" if len(points) < 30 else None, label=name)
            for resumed in (m["resumed_at"] for m in run["metrics"] if key == "loss" and "resumed_at" in m):
                ax.axvline(resumed, color="grey", linestyle="--", label=f"resumed from the step {resumed} checkpoint")
        ax.set_title(title if len(logged) == 1 or key == "loss" else ylabel)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _median(metrics: list[dict], key: str):
    values = [m[key] for m in metrics if isinstance(m.get(key), (int, float))]
    return statistics.median(values) if values else None


def _last(metrics: list[dict], key: str):
    values = [m[key] for m in metrics if isinstance(m.get(key), (int, float))]
    return values[-1] if values else None


def _fmt(value) -> str:
    if value is None:
        return "–"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _reported(meta) -> str:
    return ", ".join(f"{k} {v}" for k, v in OmegaConf.to_container(meta.reported).items()) or "–"


PROTOCOL_HEADLINES = {  # eval/<stem>.json of `scale eval <protocol> --run-dir` and `scale viz attention --run-dir`
    "retrieval": lambda r: f"{r['dataset']} mAP M {r['medium_map']:.1f}, H {r['hard_map']:.1f}",
    "copy_detection": lambda r: f"strong mAP {r['strong_map']:.1f}",
    "video_segmentation": lambda r: f"J&F {r['jf_mean']:.1f}, J {r['j_mean']:.1f}, F {r['f_mean']:.1f}",
    "attention": lambda r: ", ".join(
        f"Jaccard {label} {entry['jaccard_best_head']:.1f} (best head)" for label, entry in r.get("jaccard", {}).items()
    ),
}


def protocol_table(runs: list[dict]) -> list[str]:
    """Paper numbers next to the retrieval, copy-detection, video-segmentation and attention-mask results."""
    rows = []
    for run in runs:
        meta = run["config"].meta
        for stem, result in run["evals"].items():
            kind = next((k for k in PROTOCOL_HEADLINES if stem == k or stem.startswith(f"{k}_")), None)
            if kind:
                rows.append(
                    f"| {meta.name} | {meta.table} | {_reported(meta)} | {stem} | {PROTOCOL_HEADLINES[kind](result)} |"
                )
    if not rows:
        return []
    return [
        "## Retrieval, copy detection, video segmentation, attention masks",
        "",
        "| recipe | table | reported | evaluation | measured |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]


def markdown_table(runs: list[dict]) -> str:
    """Paper-reported numbers (meta.reported) next to what the run measured."""
    lines = [
        "| recipe | paper | table | row | reported | measured k-NN top-1 | measured val top-1 | final loss | "
        "images/s (median over the run) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        meta = run["config"].meta
        reported = _reported(meta)
        knn = run["evals"].get("knn_after", run["evals"].get("knn", {})).get("top1")
        val = run["evals"].get("val", {}).get("top1")
        lines.append(
            f"| {meta.name} | {meta.paper} | {meta.table} | {meta.row} | {reported} | {_fmt(knn)} | "
            f"{_fmt(val)} | {_fmt(_last(run['metrics'], 'loss'))} | "
            f"{_fmt(_median(run['metrics'], 'images_per_s'))} |"
        )
    return "\n".join(lines)


def copy_pictures(runs: list[dict], out_dir: Path) -> list[str]:
    """The PNGs `scale viz` (or the demo) wrote under <run>/viz/, copied next to the report and shown in it."""
    lines = []
    for run in runs:
        for png in sorted((run["root"] / "viz").glob("*.png")):
            target = out_dir / f"{run['root'].name}_{png.name}"
            shutil.copyfile(png, target)
            lines += [f"![{png.stem}]({target.name})", ""]
    return lines


def write_report(
    run_dirs: list[str | Path],
    out_dir: str | Path,
    title: str = "scale report",
    extra_sections: list[str] | None = None,
) -> Path:
    runs = [load_run(p) for p in run_dirs]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = [f"# {title}", "", markdown_table(runs), "", IMAGES_PER_S, ""] + protocol_table(runs)
    parts += extra_sections or []
    for name, (keys, labels, plot_title) in PLOTS.items():
        png = plot_series(runs, keys, labels, out_dir / f"{name}.png", plot_title)
        if png:
            parts += [f"![{plot_title}]({png.name})", ""]
    parts += copy_pictures(runs, out_dir)
    report = out_dir / "report.md"
    report.write_text("\n".join(parts))
    return report
