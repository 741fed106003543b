"""Where a run's metrics go: metrics.jsonl always, and the experiment trackers the recipe names in
`train.trackers` (TensorBoard, Weights & Biases, MLflow) behind one interface (scale.trackers.sink), on rank 0
only. Each tracker's run id is kept in <run>/trackers.json with the last step it received, so that a requeued job
appends to the same tracker run and a step logged before a crash and logged again after the resume (from an
older checkpoint) is sent once; the steps a killed attempt sent but its tracker never wrote (W&B offline: records
still queued in its service) are sent again from metrics.jsonl. docs/how-to/trackers.md."""

import importlib
import importlib.util
import json
import logging
import os
import random
import subprocess
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from scale.errors import ConfigError, UserError, is_disk_full
from scale.nofollow import open_fd, write_atomic
from scale.readback import RUN_CONFIG, TRACKERS, BadFile, read_json, read_metrics, read_yaml
from scale.trackers.jsonl import JsonlSink

log = logging.getLogger(__name__)

SINKS = {  # train.trackers name -> class (module:name)
    "tensorboard": "scale.trackers.tensorboard:TensorBoardSink",
    "wandb": "scale.trackers.wandb_run:WandbSink",
    "mlflow": "scale.trackers.mlflow_run:MlflowSink",
}
STATE_FILE = "trackers.json"
# seconds all trackers together may take to close: a preempted job has Slurm's KillWait (30 s by default) from its
# signal to the SIGKILL, the checkpoint comes first; a tracker still uploading then is left to its own files
CLOSE_TIMEOUT_S = 5.0


def sink_class(name: str):
    module, _, attr = SINKS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def check_trackers(cfg: DictConfig) -> None:
    """Before any rank starts: known names, and their packages installed (without importing them)."""
    for name in cfg.train.trackers:
        if name not in SINKS:
            raise ConfigError(f"train.trackers: '{name}' is not one of: {', '.join(SINKS)}")
        package = sink_class(name).package
        if importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"train.trackers names {name}, whose package '{package}' is not installed: "
                f"pip install 'scale[trackers]'"
            )


def check_stores(cfg: DictConfig, root: Path) -> None:
    """Before any rank starts, once the run directory is checked: each tracker's local store (its folder created,
    a probe file written and removed), so that a store that cannot be written is one line (exit 2), not rank 0's
    traceback once training has started. A server's store is not checked here: its failures cost that tracker's
    metrics (Trackers)."""
    settings = tracker_settings(cfg)
    for name in cfg.train.trackers:
        for store in sink_class(name).stores(settings, root):
            try:
                store.mkdir(parents=True, exist_ok=True)
                probe = store / f".write-probe-{os.getpid()}"
                os.close(open_fd(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
                probe.unlink()
            except OSError as err:
                raise ConfigError(
                    f"train.trackers: {name} cannot write its store {store} ({err.strerror or err}); point "
                    f"it at a folder this job can write (docs/how-to/trackers.md) or leave {name} out"
                ) from None


def git_commit() -> str | None:
    """The commit of the scale checkout that runs (None when it is not a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def run_config(cfg: DictConfig, root: Path) -> dict:
    """What the trackers record as the run's config: the resolved recipe (with its `sources` block, where each
    stated value comes from), the git commit and the run directory."""
    recipe = OmegaConf.to_container(cfg, resolve=True)
    return {**recipe, "scale": {"git_commit": git_commit(), "run_dir": str(root.resolve())}}


def tracker_settings(cfg: DictConfig) -> DictConfig:
    """train.tracker as set in the recipe (an empty key: the tracker's environment variable, else the default),
    with `default_project` (meta.paper, else "scale") and the run's name (meta.name unless set)."""
    settings = OmegaConf.create(OmegaConf.to_container(cfg.train.tracker, resolve=True))
    settings.default_project = cfg.meta.paper or "scale"
    settings.name = settings.name or cfg.meta.name
    return settings


class TrackerState:
    """<run>/trackers.json: {"ids": {tracker: run id}, "last_step": the last step the trackers received, "since":
    the step the current tracker runs began from (a rollback's, else 0)}."""

    def __init__(self, root: Path):
        self.path = root / STATE_FILE
        try:
            saved = read_json(self.path, TRACKERS) if self.path.exists() else {"ids": {}, "last_step": 0}
        except BadFile as err:
            raise UserError(
                f"{err}; it holds the trackers' run ids: delete it to continue in new tracker runs"
            ) from None
        self.ids: dict[str, str] = saved["ids"]
        self.last_step: int = saved["last_step"]
        self.since: int = saved.get("since", 0)

    def save(self) -> None:
        write_atomic(self.path, json.dumps({"ids": self.ids, "last_step": self.last_step, "since": self.since}))


def branch(state: TrackerState, step: int) -> None:
    """A rolled-back run is a new timeline: the trackers' runs that went past `step` are kept as they are (a W&B
    run cannot take a step lower than one it has), and the run continues in new tracker runs from `step`."""
    log.warning(
        "trackers: the run continues from step %d in new tracker runs; the previous ones (%s) end at step %d",
        step,
        ", ".join(f"{name} {run_id}" for name, run_id in state.ids.items()) or "none",
        state.last_step,
    )
    state.ids, state.last_step, state.since = {}, step, step


def open_sinks(cfg: DictConfig, root: Path, state: TrackerState, tolerate=None) -> dict:
    """The recipe's trackers, reopened by the ids in `state`. `tolerate(name)`: a context that turns a tracker's
    failure to open into its absence (training); without it, the failure is raised (attach_artifacts)."""
    settings, config = tracker_settings(cfg), run_config(cfg, root)
    sinks = {}
    for name in cfg.train.trackers:
        with tolerate(name, "opening its run") if tolerate else nullcontext():
            if name not in state.ids and (run_id := sink_class(name).new_id()) is not None:
                state.ids[name] = run_id  # saved before the run exists: a kill in between cannot make a second
                state.save()
            sinks[name] = sink_class(name)(settings, root, state.ids.get(name), config)
            if sinks[name].run_id is not None:
                state.ids[name] = sinks[name].run_id
    state.save()
    return sinks


@contextmanager
def python_random_kept():
    """Python's global `random` stream as it was before the block, whatever the block drew from it (on the
    calling thread: not thread-safe). The trackers' libraries draw from it (MLflow numbers a new experiment with
    it), on rank 0 only, and not in every launch alike (only the launch that creates the experiment; the trackers
    open after the resume restored the RNG); the stream is checkpointed per rank (scale.checkpoint.state), so such
    a draw left rank 0's saved stream differing from the uninterrupted run's (tools/soak)."""
    state = random.getstate()
    try:
        yield
    finally:
        random.setstate(state)


class Trackers:
    """The loop's one metrics writer: `log(step, record)` on log steps, `close()` at the end; a no-op off rank 0."""

    def __init__(self, cfg: DictConfig, root: Path, enabled: bool, branch_at: int | None = None):
        """`branch_at`: the step a deliberate rollback or reset (train.resume_step, train.reset) continues from."""
        self.enabled = enabled
        if not enabled:
            return
        self.jsonl = JsonlSink(root / "metrics.jsonl")
        self.state = TrackerState(root)
        if branch_at is not None and branch_at < self.state.last_step:
            branch(self.state, branch_at)
        self.failed: set[str] = set()  # trackers dropped after a failure (warned once each)
        self.sinks: dict = {}  # what a failure while opening drops from (none opened yet)
        with python_random_kept():
            self.sinks = open_sinks(cfg, root, self.state, self._tracker_failure_tolerated)
        self.replayed = False
        self.disk_full = False  # warned once
        with python_random_kept():
            self._resend_unwritten(root / "metrics.jsonl")

    def log(self, step: int, record: dict) -> None:
        if self.enabled:
            with self._disk_full_tolerated(f"the metrics of step {step}"):
                self._log(step, record)

    def _log(self, step: int, record: dict) -> None:
        self.jsonl.log(step, record)
        if step <= self.state.last_step:
            if not self.replayed:
                log.info("trackers: steps up to %d were sent before this resume; not sent again", self.state.last_step)
                self.replayed = True
            return
        with python_random_kept():
            for name, sink in list(self.sinks.items()):
                if sink.held_step is not None and step <= sink.held_step:
                    continue  # written before a kill that came before trackers.json counted it
                with self._tracker_failure_tolerated(name, f"logging step {step}"):
                    sink.log(step, scalars(record))
        self.state.last_step = step
        self.state.save()

    def _resend_unwritten(self, metrics: Path) -> None:
        """A tracker that holds fewer steps than trackers.json says were sent (`held_step`: W&B offline after a
        SIGKILL) gets the missing ones again, from the last metrics.jsonl line of each (after a rollback, the
        current timeline's). The steps are sent in order, each once and before any new one, so a resumed W&B run
        never goes back below a step it has."""
        behind = {
            name: max(sink.held_step, self.state.since)
            for name, sink in self.sinks.items()
            if sink.held_step is not None and max(sink.held_step, self.state.since) < self.state.last_step
        }
        if not behind:
            return
        last = {record["step"]: record for record in read_metrics(metrics, skip=True)}
        for name, held in behind.items():
            steps = [s for s in sorted(last) if held < s <= self.state.last_step]
            log.warning(
                "trackers: %s holds steps up to %d of the %d sent before (lost in a kill); sending %d again from "
                "metrics.jsonl",
                name,
                held,
                self.state.last_step,
                len(steps),
            )
            for step in steps:
                with self._tracker_failure_tolerated(name, f"logging step {step} again"):
                    self.sinks[name].log(step, scalars(last[step]))

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Close every sink, the trackers' in background threads that the process does not wait for: those not done
        within `timeout` seconds (an upload, a server that does not answer) are left running and named."""
        if not self.enabled:
            return
        with self._disk_full_tolerated("the last metrics"):
            self.jsonl.close()
        deadline = time.monotonic() + timeout
        threads = {
            name: threading.Thread(target=self._close, args=(name, sink), daemon=True)
            for name, sink in list(self.sinks.items())
        }
        with python_random_kept():  # kept here, not in each thread: they would put back each other's states
            for thread in threads.values():
                thread.start()
            for thread in threads.values():
                thread.join(max(deadline - time.monotonic(), 0.0))
        late = [name for name, thread in threads.items() if thread.is_alive()]
        if late:
            log.warning(
                "trackers: %s did not close within %.0f s; not waiting (their local files hold the run: W&B's "
                "`wandb sync` uploads them)",
                ", ".join(late),
                timeout,
            )

    def _close(self, name: str, sink) -> None:
        with self._tracker_failure_tolerated(name, "closing its run"):
            sink.close()

    @contextmanager
    def _tracker_failure_tolerated(self, name: str, doing: str):
        """A tracker that fails (its store unwritable, a full disk, a server gone, its library's own error) costs
        its own metrics from then on, never the run: one warning, and the tracker is dropped. metrics.jsonl, the
        run's own record, keeps every step."""
        try:
            yield
        except Exception as err:  # any library's error: the run goes on whatever the tracker raised
            self.sinks.pop(name, None)
            if name not in self.failed:
                log.warning(
                    "trackers: %s failed %s (%s: %s); the run goes on without it (metrics.jsonl has every step)",
                    name,
                    doing,
                    type(err).__name__,
                    str(err).splitlines()[0] if str(err) else "",
                )
            self.failed.add(name)

    @contextmanager
    def _disk_full_tolerated(self, what: str):
        """A full disk loses metrics lines, never the run: the next checkpoint checks the free space and stops the
        run cleanly (scale.checkpoint.diskspace), and a resumed run logs the steps after that checkpoint again."""
        try:
            yield
        except OSError as err:
            if not is_disk_full(err):
                raise
            if not self.disk_full:
                log.warning("trackers: %s not written (%s); the next checkpoint checks the free space", what, err)
            self.disk_full = True


def scalars(record: dict) -> dict[str, float]:
    """What the trackers get of a metrics record: its numbers (not flags, texts, the step or the time)."""
    return {
        k: float(v)
        for k, v in record.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "time")
    }


def attach_artifacts(root: Path, paths: list[Path]) -> None:
    """Reopen the trackers of the finished run in `root` (its config.yaml and trackers.json) and attach files or
    folders to their runs: the report's plots, exported weights."""
    from scale.config.load import from_dict

    cfg = from_dict(read_yaml(root / "config.yaml", RUN_CONFIG), str(root / "config.yaml"))
    if not cfg.train.trackers:
        return
    sinks = open_sinks(cfg, root, TrackerState(root))
    for sink in sinks.values():
        sink.attach([Path(p) for p in paths])
        sink.close()
