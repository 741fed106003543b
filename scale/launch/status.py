"""What a run directory says about its run: step, epoch, loss, throughput, ETA, last checkpoint, Slurm state.

Everything is read defensively: a run that has not started, a half-written metrics line or a missing checkpoint
pointer give empty fields, never an error.
"""

import re
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from scale.errors import UserError
from scale.launch import slurm
from scale.readback import LATEST, RUN_CONFIG, BadFile, read_line, read_metrics, read_yaml
from scale.watch.heartbeat import EVERY_S, read_heartbeat

RATE_WINDOW = 20  # metrics lines the throughput and ETA are averaged over


@dataclass
class RunStatus:
    run_dir: str
    step: int | None = None
    total_steps: int | None = None
    epoch: float | None = None
    loss: float | None = None
    images_per_s: float | None = None
    steps_per_s: float | None = None
    eta_s: float | None = None
    last_checkpoint: str | None = None
    checkpoint_step: int | None = None
    job_id: str | None = None
    slurm: dict | None = None
    # from rank 0's heartbeat.json (scale.watch.heartbeat): the step running, its phase and for how long, the
    # heartbeat's age (a run whose heartbeat stopped is not alive), seconds since the last metrics line
    running_step: int | None = None
    phase: str | None = None
    phase_s: float | None = None
    heartbeat_age_s: float | None = None
    since_log_s: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def train_section(config_path: Path) -> dict:
    """The saved recipe's `train` section, {} when config.yaml is missing or damaged (the fields stay empty)."""
    try:
        train = read_yaml(config_path, RUN_CONFIG).get("train")
    except (OSError, UserError):  # BadFile, or a YAML bomb
        return {}
    return train if isinstance(train, dict) else {}


def total_steps(config_path: Path) -> int | None:
    """train.max_steps, else epochs x samples_per_epoch / global_batch when the config names them all."""
    train = train_section(config_path)
    epochs, samples, batch = train.get("epochs"), train.get("samples_per_epoch"), train.get("global_batch")
    by_epochs = (
        epochs * (samples // batch) if all(isinstance(v, int) and v > 0 for v in (epochs, samples, batch)) else None
    )
    max_steps = train.get("max_steps")
    candidates = [v for v in (max_steps if isinstance(max_steps, int) else None, by_epochs) if v]
    return min(candidates) if candidates else None


def steps_from_epochs(config_path: Path, last: dict) -> int | None:
    """An epoch-mode run (train.samples_per_epoch null: the epoch is the dataset): train.epochs x the steps per
    epoch that its last metrics line shows (the loop logs `epoch` as steps done / steps per epoch)."""
    epochs = train_section(config_path).get("epochs")
    epoch = last.get("epoch")
    if not isinstance(epochs, int) or epochs <= 0 or not isinstance(epoch, (int, float)) or epoch <= 0:
        return None
    return epochs * round(last["step"] / epoch)


def is_run_dir(path: Path) -> bool:
    """Whether `path` holds a run (a config, metrics, checkpoints or a submitted job) or a sweep of runs."""
    marks = ("config.yaml", "metrics.jsonl", "checkpoints", slurm.JOB_RECORD, slurm.SCRIPT_NAME)
    return any((path / mark).exists() for mark in marks) or bool(sweep_tasks(path))


def _step_of(name: str) -> int | None:
    match = re.search(r"(\d+)$", name)
    return int(match.group(1)) if match else None


def last_checkpoint(checkpoints: Path) -> str | None:
    """The step directory the `latest` pointer names (a text file or a symlink), else the newest step directory."""
    latest = checkpoints / "latest"
    try:
        if latest.is_symlink():
            name = Path(latest.readlink()).name
        elif latest.is_file():
            name = read_line(latest, LATEST)
        else:
            name = ""
    except (OSError, BadFile):  # a damaged pointer: the newest step directory, below
        name = ""
    if name and (checkpoints / name).is_dir():
        return name
    try:
        steps = [
            p.name
            for p in checkpoints.iterdir()
            if p.is_dir() and _step_of(p.name) is not None and not p.name.startswith(".")
        ]
    except OSError:
        return None
    return max(steps, key=_step_of) if steps else None


def _rate(records: list[dict]) -> float | None:
    """Steps per second over the last lines of the current segment: walking back from the newest line, stop at a
    long pause (a requeue or resume) or where the step goes backwards (a restart from an older checkpoint)."""
    window = [r for r in records[-RATE_WINDOW:] if isinstance(r.get("time"), (int, float))]
    if len(window) < 2:
        return None
    gaps = [b["time"] - a["time"] for a, b in zip(window, window[1:])]
    typical = statistics.median(gaps)
    start = len(window) - 1
    while start > 0 and gaps[start - 1] <= 5 * typical and window[start - 1]["step"] < window[start]["step"]:
        start -= 1
    first, last = window[start], window[-1]
    seconds, steps = last["time"] - first["time"], last["step"] - first["step"]
    return steps / seconds if steps > 0 and seconds > 0 else None


def run_status(run_dir: str | Path, query_slurm: bool = True) -> RunStatus:
    root = Path(run_dir)
    status = RunStatus(run_dir=str(root))
    records = read_metrics(root / "metrics.jsonl", skip=True)
    status.total_steps = total_steps(root / "config.yaml")
    if records:
        last = records[-1]
        status.step = int(last["step"])
        if status.total_steps is None:
            status.total_steps = steps_from_epochs(root / "config.yaml", last)
        status.epoch = last.get("epoch")
        status.loss = last.get("loss")
        status.images_per_s = last.get("images_per_s")
        status.steps_per_s = _rate(records)
        if status.total_steps is not None:
            remaining = max(status.total_steps - status.step, 0)
            if remaining == 0:
                status.eta_s = 0.0
            elif status.steps_per_s:
                status.eta_s = remaining / status.steps_per_s
    read_live(status, root, records)
    status.last_checkpoint = last_checkpoint(root / "checkpoints")
    if status.last_checkpoint is not None:
        status.checkpoint_step = _step_of(status.last_checkpoint)
    status.job_id = slurm.recorded_job(root)
    if query_slurm and status.job_id is not None:
        status.slurm = slurm.job_state(status.job_id)
    return status


def read_live(status: RunStatus, root: Path, records: list[dict]) -> None:
    """The heartbeat's fields, and the time since the last metrics line."""
    now = time.time()
    if records and isinstance(records[-1].get("time"), (int, float)):
        status.since_log_s = max(now - records[-1]["time"], 0.0)
    beat = read_heartbeat(root)
    if beat is None or not all(isinstance(beat.get(k), (int, float)) for k in ("step", "phase_since", "time")):
        return
    status.running_step, status.phase = int(beat["step"]), str(beat.get("phase"))
    status.phase_s = max(now - beat["phase_since"], 0.0)
    status.heartbeat_age_s = max(now - beat["time"], 0.0)


def phase_text(status: RunStatus) -> str:
    """'backward for 00:02:10 (step 41)', or how the run ended, or how long ago a dead run's heartbeat stopped."""
    if status.phase is None:
        return "-"
    if status.phase in ("finished", "preempted", "stopped"):
        return status.phase
    text = f"{status.phase} for {_duration(status.phase_s)} (step {status.running_step})"
    if status.heartbeat_age_s is not None and status.heartbeat_age_s > 10 * EVERY_S:
        text += f"; no heartbeat for {_duration(status.heartbeat_age_s)}: not running?"
    return text


def sweep_tasks(run_dir: str | Path) -> list[Path]:
    """The task run directories of a sweep submitted into this directory (empty for a single run)."""
    return sorted(p for p in Path(run_dir).glob("task_[0-9]*") if p.is_dir())


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{days}d " if days else "") + f"{hours:02d}:{minutes:02d}:{secs:02d}"


def summary_row(status: RunStatus) -> dict[str, str]:
    """Display strings for one run."""

    def num(value, fmt):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "-"
        return str(value) if isinstance(value, int) else format(value, fmt)

    step = "-" if status.step is None else str(status.step)
    if status.total_steps is not None:
        step += f"/{status.total_steps}"
    slurm_state = "-"
    if status.slurm:
        slurm_state = status.slurm.get("jobstate", "?")
        if status.slurm.get("restarts", "0") not in ("0", ""):
            slurm_state += f" (requeued {status.slurm['restarts']}x)"
        reason = status.slurm.get("reason")
        if reason and reason != "None":
            slurm_state += f" [{reason}]"
    elif status.job_id:
        slurm_state = "unknown to Slurm"
    return {
        "run": status.run_dir,
        "step": step,
        "epoch": num(status.epoch, ".2f"),
        "loss": num(status.loss, ".4f"),
        "images/s": num(status.images_per_s, ".1f"),
        "eta": _duration(status.eta_s),
        "phase": phase_text(status),
        "last log": "-" if status.since_log_s is None else f"{_duration(status.since_log_s)} ago",
        "checkpoint": status.last_checkpoint or "-",
        "job": status.job_id or "-",
        "slurm": slurm_state,
    }
