"""Run reports: a markdown table of the paper's numbers next to ours, and PNG plots of loss, k-NN accuracy,
validation accuracy and throughput, all read from run directories (config.yaml, metrics.jsonl, eval/*.json)."""

import json
import shutil
from pathlib import Path

from scale.extras import require

require("viz", "matplotlib", "the report's plots").use("Agg")  # files only: runs on headless nodes
import matplotlib.pyplot as plt  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from scale.errors import UserError  # noqa: E402
from scale.loop.rundir import RunDir, read_metrics  # noqa: E402

PLOTS = {  # file stem -> (metric, y label, title)
    "loss": ("loss", "training loss", "Training loss"),
    "knn": ("knn_monitor_top1", "k-NN monitor top-1 (%)", "k-NN monitor during training (training features)"),
    "probe": ("probe_top1", "online probe top-1 (%)", "Online linear probe on the training batches"),
    "val": ("val_top1", "validation top-1 (%)", "Validation top-1"),
    "throughput": ("images_per_s", "images/s (as defined above)", "Training throughput"),
}
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
        evals[file.stem] = json.loads(file.read_text())
    return {
        "root": run.root,
        "config": OmegaConf.load(run.config),
        "metrics": read_metrics(run.metrics),
        "evals": evals,
    }


def plot_series(runs: list[dict], key: str, ylabel: str, out: Path, title: str = "") -> Path | None:
    """One line per run of metric `key` against the step, with each resume (`resumed_at` in metrics.jsonl) marked
    on the loss plot; None when no run logged it."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    drawn = False
    for run in runs:
        points = [(m["step"], m[key]) for m in run["metrics"] if isinstance(m.get(key), (int, float))]
        if points:
            steps, values = zip(*points)
            ax.plot(steps, values, marker="o" if len(points) < 30 else None, label=run["config"].meta.name)
            drawn = True
            for resumed in (m["resumed_at"] for m in run["metrics"] if key == "loss" and "resumed_at" in m):
                ax.axvline(resumed, color="grey", linestyle="--", label=f"resumed from the step {resumed} checkpoint")
    if not drawn:
        plt.close(fig)
        return None
    ax.set_title(title or ylabel)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


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
        "images/s (last logged step) |",
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
            f"{_fmt(_last(run['metrics'], 'images_per_s'))} |"
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
    for name, (key, label, plot_title) in PLOTS.items():
        png = plot_series(runs, key, label, out_dir / f"{name}.png", plot_title)
        if png:
            parts += [f"![{plot_title}]({png.name})", ""]
    parts += copy_pictures(runs, out_dir)
    report = out_dir / "report.md"
    report.write_text("\n".join(parts))
    return report
