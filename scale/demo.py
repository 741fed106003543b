"""The main job on a laptop: shards from embedded images, k-NN at random init, training on 2 CPU processes that is
interrupted once and resumed, k-NN of the trained teacher, a throughput measurement and a report with plots."""

import io
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from scale import faults
from scale.checkpoint.export import export
from scale.config import load_recipe
from scale.data.embedded import build
from scale.engine.dist import detect
from scale.errors import PREEMPTED_EXIT_CODE, UserError
from scale.eval import knn
from scale.eval.session import open_session
from scale.launch.local import fresh_environment
from scale.loop.rundir import write_json
from scale.readback import read_metrics
from scale.report import write_report
from scale.trackers import attach_artifacts, check_trackers

log = logging.getLogger(__name__)

BENCH_STEPS = 6
# a signal to the demo is passed on to the command it is running, whose launcher passes it on to its ranks
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)

STORIES = {  # method -> (recipe, embedded data set, which backbone is evaluated)
    "dino": ("demo/dino_tiny", "digits", "teacher-backbone"),
    "esvit": ("demo/esvit_tiny", "digits", "teacher-backbone"),
    "mocov3": ("demo/mocov3_tiny", "digits", "teacher-backbone"),
    "drloc": ("demo/drloc_tiny", "digits", "student-backbone"),
}


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def run_scale(args: list[str], env: dict, **popen_kwargs) -> tuple[int, str]:
    """`scale *args` to its end: its exit status and what it printed to a pipe. A signal to the demo meanwhile is
    passed on to it and, once it has exited (a run checkpoints first), stops the demo with status 128 + signal."""
    procs, received = [], []

    def forward(signum, _frame):
        received.append(signum)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}  # before the start: no signal is missed
    try:
        procs.append(subprocess.Popen([sys.executable, "-m", "scale.cli", *args], env=env, text=True, **popen_kwargs))
        if received:
            procs[0].send_signal(received[0])
        out, _ = procs[0].communicate()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        say(f"stopped by {signal.Signals(received[0]).name}: `scale {args[0]}` has exited, nothing is left running")
        raise SystemExit(128 + received[0])
    return procs[0].returncode, out or ""


def train_with_interruption(
    recipe: str, overrides: list[str], run_dir: Path, env: dict, interrupt_at: int, nproc: int
) -> None:
    """Train; after step `interrupt_at` every rank receives SIGUSR1 (as Slurm's preemption notice would send it),
    the run checkpoints and exits for requeue, and is resumed from its checkpoint."""
    args = ["train", recipe, *overrides, "--run-dir", str(run_dir), "--nproc", str(nproc)]
    say(f"the run will receive SIGUSR1 after step {interrupt_at}, like a preemption notice")
    status, _ = run_scale(args, {**env, faults.ENV: faults.spec("preempt", interrupt_at)})
    if status == PREEMPTED_EXIT_CODE:
        say(
            f"interrupted at step {interrupt_at}: the run checkpointed and exited for requeue; resuming from its "
            f"latest checkpoint"
        )
        status, _ = run_scale(args, env)
    elif status == 0:
        raise UserError(f"the run finished without being interrupted at step {interrupt_at}; see {run_dir / 'logs'}")
    if status != 0:
        raise UserError(f"training failed with exit status {status}; see {run_dir / 'logs'}")


def knn_of(recipe: str, overrides: list[str], weights: str | None, out: Path) -> dict:
    cfg = load_recipe(recipe, overrides)
    result = knn.run(open_session(cfg, detect({}), torch.device("cpu"), weights))
    write_json(out, result)
    return result


def run_demo(
    method: str = "dino",
    run_dir: str | Path = "runs/demo",
    steps: int | None = None,
    nproc: int = 2,
    bench: bool = True,
    trackers: list[str] | None = None,
) -> Path:
    """`bench`: step 5, the engine benchmark (a third of a short story's time); without it the report has none.
    `trackers`: wandb and/or mlflow besides TensorBoard (train.trackers); the report and the exported weights
    are attached to their run at the end."""
    if method not in STORIES:
        raise UserError(f"--method must be one of {', '.join(STORIES)}, got '{method}'")
    recipe, dataset, evaluated = STORIES[method]
    run_dir = Path(run_dir).resolve() / method
    data_root = run_dir.parent / "data"
    os.environ["SCALE_DATA"] = str(data_root)  # the demo recipes read their shards from ${SCALE_DATA}
    env = fresh_environment()  # the demo launches its own ranks
    env["OMP_NUM_THREADS"] = "1"
    env["KINETO_LOG_LEVEL"] = "5"  # the profiled benchmark step would print CUDA probe errors on a CPU machine
    overrides = [f"train.max_steps={steps}"] if steps else []
    if trackers:
        overrides.append(f"train.trackers=[{','.join(['tensorboard', *trackers])}]")
        check_trackers(load_recipe(recipe, overrides))  # before the shards are built
    started = time.time()

    say(f"1/6 building WebDataset shards of the embedded '{dataset}' images under {data_root}")
    build(dataset, data_root / "embedded" / dataset, progress=True)

    say("2/6 k-NN accuracy of the backbone at random initialisation")
    before = knn_of(recipe, overrides, None, run_dir / "eval" / "knn_before.json")

    planned = _planned_steps(recipe, overrides)
    say(f"3/6 training {recipe} on {nproc} CPU processes ({planned} steps)")
    train_with_interruption(recipe, overrides, run_dir, env, interrupt_at=max(planned // 3, 1), nproc=nproc)

    say("4/6 k-NN accuracy and attention maps of the trained backbone")
    weights = export(run_dir, evaluated, "safetensors", run_dir / "export" / f"{evaluated}.safetensors")
    after = knn_of(recipe, overrides, str(weights), run_dir / "eval" / "knn_after.json")
    pictures = attention_pictures(recipe, overrides, str(weights), run_dir / "viz")

    bench_table = None
    if bench:
        say(f"5/6 throughput benchmark: {BENCH_STEPS} timed steps per engine on {nproc} processes")
        bench_table = benchmark(recipe, overrides, run_dir / "bench", env, nproc)
    else:
        say("5/6 throughput benchmark: skipped (--no-bench)")

    say("6/6 writing the report")
    summary = _summary(before, after, bench_table, run_dir, time.time() - started) + _attention_note(pictures)
    report = write_report([run_dir], run_dir / "report", title=f"scale demo: {method}", extra_sections=summary)
    attach_artifacts(run_dir, [report.parent, weights])
    say(f"k-NN top-1: random init {before['top1']:.1f}% -> trained {after['top1']:.1f}%")
    say(f"report: {report}")
    return report


def attention_pictures(recipe: str, overrides: list[str], weights: str, out: Path, digits: int = 2) -> list[Path]:
    """DINO Fig. 1 for the demo: the last-block attention of the trained ViT next to random init's, on val digits
    drawn at 64 px (16x16 patches: the 16 px training size gives a 4x4 grid, too coarse to show a shape). Backbones
    without global attention (Swin) get none."""
    from PIL import Image

    from scale.checkpoint.weights import load_backbone
    from scale.data.embedded import source
    from scale.eval.images import patch_size, to_input
    from scale.models.vit import ViT
    from scale.viz.figures import attention_picture

    cfg = load_recipe(recipe, overrides)
    torch.manual_seed(cfg.train.seed)
    backbones = {"random init": load_backbone(cfg.model, None, torch.device("cpu"))}
    if not isinstance(backbones["random init"], ViT):
        return []
    backbones["trained"] = load_backbone(cfg.model, weights, torch.device("cpu"))
    mean, std = list(cfg.data.views.mean), list(cfg.data.views.std)
    pictures = []
    for item in source("digits", "val").items[:digits]:
        with Image.open(io.BytesIO(item.data)) as digit:
            image = to_input(digit.convert("RGB"), 64, patch_size(backbones["trained"]), mean, std)
        name = f"attention_digit{len(pictures)}_label{item.label}.png"
        title = f"{cfg.model.name}: last-block self-attention per head, val digit '{item.label}' at 64 px"
        pictures.append(attention_picture(backbones, image, mean, std, 0.6, title, out / name))
    return pictures


def _attention_note(pictures: list[Path]) -> list[str]:
    if not pictures:
        return []
    return [
        "## Attention maps (DINO Fig. 1/3)",
        "",
        "Last-block self-attention per head of the random-init and trained backbones on val digits, with the masks "
        "keeping 60% of the attention mass. The demo's ViT has no class token (average pooling), so the query is "
        "the mean over the patch queries; the digits are drawn at 64 px (16x16 patches), four times the 16 px the "
        "model was trained at (a 4x4 grid shows no shape), with the position embeddings interpolated. Random-init "
        "attention already follows the stroke's contrast (its tokens are projections of the pixels); the "
        "difference between the two rows is what training changed. The pictures are below.",
        "",
    ]


def benchmark(recipe: str, overrides: list[str], out: Path, env: dict, nproc: int) -> str:
    """`scale bench` of the demo recipe under DDP and FSDP2; returns its printed table (its log is kept in `out`)."""
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "bench",
        recipe,
        *overrides,
        "--steps",
        str(BENCH_STEPS),
        "--warmup",
        "2",
        "--nproc",
        str(nproc),
        "--matrix",
        "engine=ddp,fsdp2",
        "--json",
        str(out / "bench.json"),
    ]
    with open(out / "bench.log", "w") as log_file:
        status, table = run_scale(args, env, stdout=subprocess.PIPE, stderr=log_file)
    (out / "bench.txt").write_text(table)
    if status != 0:
        raise UserError(f"the benchmark failed with exit status {status}; see {out / 'bench.log'}")
    print(table, end="", flush=True)
    return table


def _planned_steps(recipe: str, overrides: list[str]) -> int:
    from scale.data.factory import build_loader
    from scale.data.spec import LoaderSpec

    cfg = load_recipe(recipe, overrides)
    loader = build_loader(
        LoaderSpec(cfg.data, "train", cfg.train.global_batch, 0, 1, cfg.train.seed, cfg.train.samples_per_epoch)
    )
    total = cfg.train.epochs * loader.steps_per_epoch
    return min(total, cfg.train.max_steps) if cfg.train.max_steps else total


def _summary(before: dict, after: dict, bench_table: str | None, run_dir: Path, seconds: float) -> list[str]:
    metrics = read_metrics(run_dir / "metrics.jsonl")
    speeds = [m["images_per_s"] for m in metrics if "images_per_s" in m]
    lines = [
        f"## k-NN accuracy (val, top-1 %, k={after['k']})",
        "",
        "| backbone | top-1 | top-5 |",
        "|---|---|---|",
        f"| random init | {before['top1']:.2f} | {before['top5']:.2f} |",
        f"| trained | {after['top1']:.2f} | {after['top5']:.2f} |",
        "",
        f"Gain over random init: {after['top1'] - before['top1']:+.2f} points.",
        "",
        "This k-NN embeds the whole train split with the final weights (eval resize and crop) and classifies the "
        "val split (DINO's eval_knn). The k-NN monitor plotted below differs: during training, each step's "
        "augmented training views are classified against a queue of earlier steps' features, computed by older "
        "weights (MoCo v3's monitor), so it lags and reads lower or higher than this number.",
        "",
    ]
    if speeds:
        ordered = sorted(speeds)
        lines += [
            "## Throughput",
            "",
            f"Median {ordered[len(ordered) // 2]:.1f} images/s over {len(speeds)} logged steps (as defined above; "
            f"CPU, gloo).",
            "",
        ]
    if bench_table is not None:
        lines += [
            "## Benchmark (`scale bench`)",
            "",
            "Its images/s are `scale bench`'s: the wall clock of whole steps (data wait included, the slowest "
            "rank's) after warm-up, each engine separately, so they differ from the training run's.",
            "",
            "```",
            bench_table.rstrip(),
            "```",
            "",
        ]
    lines += [f"The whole demo took {seconds / 60:.1f} minutes.", ""]
    return lines
