"""The trackers behind scale.trackers.Trackers, with the real packages offline: every sink receives each step
once; a run reopened in the same run directory (a requeue) appends to the same W&B and MLflow run and does not
send again the steps it sent before; the recipe, its sources and the git commit are the run's config; artifacts
attach at the end; a tracker whose package is missing is a ConfigError naming the extra."""

import errno
import importlib.util
import json
import os

import pytest
from omegaconf import OmegaConf

from scale import faults
from scale.cli import main as cli
from scale.config import load_recipe
from scale.errors import PREEMPTED_EXIT_CODE, ConfigError
from scale.loop.rundir import RunDir
from scale.trackers import Trackers, attach_artifacts, check_trackers
from scale.trackers.sink import Sink
from tests.helpers_run import TINY, run_train
from tests.trackers.offline_stores import mlflow_runs, wandb_attempts

ALL = ["train.trackers=[tensorboard,wandb,mlflow]", "train.tracker.offline=true", "train.tracker.tags=[demo]"]


def recipe(overrides=()):
    return load_recipe("demo/dino_tiny", [*ALL, *overrides])


def attempt(cfg, root, steps) -> None:
    trackers = Trackers(cfg, root, enabled=True)
    for step in steps:
        trackers.log(step, {"loss": 1.0 / step, "epoch": step / 10, "flag": True, "note": "text"})
    trackers.close(timeout=300)  # read back at once: every tracker done (the bound itself: its own test below)


def tensorboard_steps(root) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(root / "tensorboard"))
    events.Reload()
    return [e.step for e in events.Scalars("loss")]


@pytest.mark.slow  # W&B starts its service process
def test_a_requeued_run_appends_to_the_same_tracker_runs_once_per_step(tmp_path):
    cfg = recipe()
    RunDir(tmp_path).create()
    OmegaConf.save(cfg, tmp_path / "config.yaml")
    attempt(cfg, tmp_path, [1, 2, 3])
    attempt(cfg, tmp_path, [2, 3, 4, 5])  # resumed from step 1's checkpoint: 2 and 3 were sent already

    first, second = wandb_attempts(tmp_path)
    assert first["id"] == second["id"]
    assert sorted(first["history"]) == [1, 2, 3] and sorted(second["history"]) == [4, 5]
    assert first["history"][3]["loss"] == pytest.approx(1 / 3)
    assert "flag" not in first["history"][3] and "note" not in first["history"][3]  # scalars only
    assert first["config"]["meta"]["name"] == cfg.meta.name
    assert "sources" in first["config"] and first["config"]["scale"]["git_commit"]

    client, runs = mlflow_runs(tmp_path)
    assert len(runs) == 1
    run = runs[0]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4, 5]
    assert run.data.params["meta.name"] == cfg.meta.name
    assert run.data.tags["mlflow.source.git.commit"] == first["config"]["scale"]["git_commit"]
    assert "demo" in run.data.tags and run.info.experiment_id
    assert run.info.status == "FINISHED"

    assert tensorboard_steps(tmp_path) == [1, 2, 3, 4, 5]
    jsonl = RunDir(tmp_path).metrics.read_text().splitlines()
    assert len(jsonl) == 7  # metrics.jsonl keeps every line written, as before

    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "report.md").write_text("# report")
    attach_artifacts(tmp_path, [tmp_path / "report"])
    client, runs = mlflow_runs(tmp_path)
    assert [a.path for a in client.list_artifacts(runs[0].info.run_id, "report")] == ["report/report.md"]
    assert wandb_attempts(tmp_path)[-1]["id"] == first["id"]
    assert wandb_attempts(tmp_path)[-1]["artifacts"] == [f"{first['id']}-outputs"]


class Killed(BaseException):
    """A SIGKILL: nothing more of the process runs (no close; what W&B's service had not written is lost)."""


@pytest.mark.slow  # W&B starts its service process
def test_wandb_offline_killed_attempts_resume_one_run_holding_each_step_once(tmp_path, monkeypatch):
    """The soak's kill -9 faults (tools/soak): a kill right after wandb.init made its run, before trackers.json
    held the id, made a second W&B run; records still queued in W&B's service when the rank was killed were lost
    while trackers.json counted them as sent, so they were never sent again; a kill after W&B wrote a step and
    before trackers.json counted it would send that step twice."""
    import wandb

    from scale.trackers.wandb_run import WandbSink

    cfg = recipe(["train.trackers=[wandb]"])
    RunDir(tmp_path).create()
    real_init, real_log = wandb.init, WandbSink.log

    def init_then_killed(**kwargs):
        real_init(**kwargs).finish()  # the run is in its files; the process dies before anything else runs
        raise Killed

    monkeypatch.setattr(wandb, "init", init_then_killed)
    with pytest.raises(Killed):
        Trackers(cfg, tmp_path, enabled=True)
    monkeypatch.undo()

    trackers = Trackers(cfg, tmp_path, enabled=True)
    # steps 4..6 still queued in W&B's service when the rank is killed: its file ends at step 3
    monkeypatch.setattr(WandbSink, "log", lambda self, step, scalars: step <= 3 and real_log(self, step, scalars))
    for step in range(1, 7):
        trackers.log(step, {"loss": 1.0 / step})
    trackers.sinks["wandb"].run.finish()  # what the service had written when the kill came
    monkeypatch.undo()

    trackers = Trackers(cfg, tmp_path, enabled=True)  # resumed from step 4's checkpoint
    save = trackers.state.save

    def save_unless_killed():
        if trackers.state.last_step == 8:
            raise Killed  # W&B has written step 8; trackers.json still says 7
        save()

    monkeypatch.setattr(trackers.state, "save", save_unless_killed)
    with pytest.raises(Killed):
        for step in range(5, 9):
            trackers.log(step, {"loss": 1.0 / step})
    trackers.sinks["wandb"].run.finish()
    monkeypatch.undo()

    attempt(cfg, tmp_path, [8, 9])  # resumed from step 7's checkpoint

    attempts = wandb_attempts(tmp_path)
    assert len(attempts) == 4 and {a["id"] for a in attempts} == {
        json.loads((tmp_path / "trackers.json").read_text())["ids"]["wandb"]
    }
    steps = sorted(s for a in attempts for s in a["history"])
    assert steps == list(range(1, 10))  # each step once: 4..6 sent again, 5, 6 and 8 not twice
    assert {s: h["loss"] for a in attempts for s, h in a["history"].items()} == pytest.approx(
        {s: 1.0 / s for s in range(1, 10)}
    )


class MemorySink(Sink):
    """A tracker whose runs are in memory (`runs[id]`: {step: loss}); what a kill lost is deleted from them."""

    runs: dict = {}

    def __init__(self, settings, root, run_id, config):
        self.run_id, self.steps = run_id, MemorySink.runs.setdefault(run_id, {})
        self.held_step = max(self.steps, default=0)

    @staticmethod
    def new_id() -> str:
        return f"run{len(MemorySink.runs)}"

    def log(self, step, scalars):
        assert step not in self.steps, f"step {step} sent twice"
        self.steps[step] = scalars["loss"]

    def close(self):
        pass


def test_steps_a_killed_tracker_lost_after_a_rollback_are_sent_again_from_the_new_timeline(tmp_path, monkeypatch):
    """Rolled back to step 2 after step 5, the new tracker run got steps 3 and 4, then the kill lost both: the
    resumed attempt sends them again with the new timeline's values (metrics.jsonl's last lines for them, not the
    first timeline's), and nothing from before the rollback."""
    from scale import trackers as module

    monkeypatch.setitem(module.SINKS, "memory", f"{__name__}:MemorySink")
    monkeypatch.setattr(MemorySink, "runs", {})
    cfg = recipe(["train.trackers=[memory]"])
    RunDir(tmp_path).create()
    attempt(cfg, tmp_path, [1, 2, 3, 4, 5])
    trackers = Trackers(cfg, tmp_path, enabled=True, branch_at=2)
    for step in (3, 4):
        trackers.log(step, {"loss": 10.0 * step})
    MemorySink.runs["run1"].clear()  # killed before the tracker wrote them
    Trackers(cfg, tmp_path, enabled=True)
    assert MemorySink.runs == {"run0": {s: 1 / s for s in range(1, 6)}, "run1": {3: 30.0, 4: 40.0}}


def test_an_unknown_or_missing_tracker_is_a_config_error_naming_the_extra(monkeypatch):
    with pytest.raises(ConfigError, match="'neptune' is not one of: tensorboard, wandb, mlflow"):
        check_trackers(load_recipe("demo/dino_tiny", ["train.trackers=[neptune]"]))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    check_trackers(load_recipe("demo/dino_tiny", ["train.trackers=[mlflow]"]))
    with pytest.raises(ConfigError, match=r"package 'wandb' is not installed: pip install 'scale\[trackers\]'"):
        check_trackers(recipe())


def test_scale_train_with_a_missing_tracker_package_exits_2_before_starting(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    args = [
        "train",
        "demo/dino_tiny",
        "train.trackers=[mlflow]",
        "--synthetic-data",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    code = cli(args)
    err = capsys.readouterr().err
    assert code == 2 and err.count("pip install 'scale[trackers]'") == 1 and "Traceback" not in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow  # two `scale train` launches of 2 processes
def test_a_preempted_and_resumed_training_is_one_tracker_run(embedded_data, tmp_path):
    overrides = [*TINY, *ALL[:2], "train.max_steps=6", "train.preempt_check_every=1"]
    first = run_train(embedded_data, tmp_path, overrides, fault=faults.spec("preempt", 3))
    assert first.returncode == PREEMPTED_EXIT_CODE, first.stderr[-3000:]
    # the checkpoint is sealed (`latest` moved, last) before the trackers close: a kill after the grace keeps it
    sealed_ms = (tmp_path / "checkpoints" / "latest").stat().st_mtime * 1000
    _, (run,) = mlflow_runs(tmp_path)
    assert run.info.status == "FINISHED" and run.info.end_time >= sealed_ms - 1
    (wandb_log,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    assert wandb_log.stat().st_mtime * 1000 >= sealed_ms - 1
    resumed = run_train(embedded_data, tmp_path, overrides)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    attempts = wandb_attempts(tmp_path)
    assert len(attempts) == 2 and attempts[0]["id"] == attempts[1]["id"]  # rank 0 only, the same run resumed
    assert [sorted(a["history"]) for a in attempts] == [[1, 2, 3], [4, 5, 6]]
    client, runs = mlflow_runs(tmp_path)
    assert len(runs) == 1
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "loss")] == [1, 2, 3, 4, 5, 6]
    jsonl = {row["step"]: row["loss"] for row in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())}
    assert {s: attempts[s > 3]["history"][s]["loss"] for s in range(1, 7)} == pytest.approx(jsonl)


def test_a_rollback_continues_in_a_new_tracker_run_and_keeps_the_old_one(tmp_path):
    """train.resume_step back to step 2 after step 5 was sent: the new timeline's steps 3 and 4 are sent (not taken
    for replays) to a new MLflow run; the first run keeps steps 1..5."""
    cfg = recipe(["train.trackers=[mlflow]"])
    RunDir(tmp_path).create()
    OmegaConf.save(cfg, tmp_path / "config.yaml")
    attempt(cfg, tmp_path, [1, 2, 3, 4, 5])
    trackers = Trackers(cfg, tmp_path, enabled=True, branch_at=2)
    for step in (3, 4):
        trackers.log(step, {"loss": 10.0 * step})
    trackers.close()

    client, runs = mlflow_runs(tmp_path)
    histories = sorted([m.step, m.value] for run in runs for m in client.get_metric_history(run.info.run_id, "loss"))
    assert len(runs) == 2
    steps = {run.info.run_id: [m.step for m in client.get_metric_history(run.info.run_id, "loss")] for run in runs}
    assert sorted(steps.values()) == [[1, 2, 3, 4, 5], [3, 4]]
    assert [30.0, 40.0] == [value for step, value in histories if value >= 10]
    assert json.loads((tmp_path / "trackers.json").read_text())["last_step"] == 4


def test_a_full_disk_drops_metrics_lines_with_one_warning_and_never_stops_the_run(tmp_path, monkeypatch, caplog):
    """The next checkpoint's own check stops the run cleanly (tests/checkpoint/test_disk_full.py); the metrics
    writers must not stop it first with a traceback. Any other OSError is still raised."""
    trackers = Trackers(load_recipe("demo/dino_tiny", ["train.trackers=[tensorboard]"]), tmp_path, enabled=True)
    trackers.log(1, {"loss": 1.0})

    def full(step, record):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trackers.jsonl, "log", full)
    monkeypatch.setattr(trackers.jsonl, "close", lambda: full(0, {}))
    with caplog.at_level("WARNING", logger="scale.trackers"):
        trackers.log(2, {"loss": 0.5})
        trackers.log(3, {"loss": 0.3})
        trackers.close()  # the TensorBoard sink still closes after the JSON lines' close failed
    warned = [r.getMessage() for r in caplog.records if "not written" in r.getMessage()]
    assert warned == [
        "trackers: the metrics of step 2 not written ([Errno 28] No space left on device); the next "
        "checkpoint checks the free space"
    ]
    assert tensorboard_steps(tmp_path) == [1]

    def denied(step, record):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(trackers.jsonl, "log", denied)
    with pytest.raises(PermissionError):
        trackers.log(4, {"loss": 0.1})


def test_a_writer_thread_that_dies_of_a_full_disk_logs_one_line_not_a_traceback(monkeypatch, caplog):
    import threading

    from scale.checkpoint.diskspace import quiet_full_disk_in_threads

    reported = []  # what Python's own hook (a traceback on stderr) would have printed
    monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args.exc_value))
    quiet_full_disk_in_threads()

    def dies_of(err):
        thread = threading.Thread(target=lambda: (_ for _ in ()).throw(err), name="event-writer")
        thread.start()
        thread.join()

    with caplog.at_level("WARNING"):
        dies_of(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert [r.getMessage() for r in caplog.records] == ["event-writer stopped writing: [Errno 122] Disk quota exceeded"]
    assert reported == []
    bug = ValueError("a bug")
    dies_of(bug)  # anything else: Python's own report, traceback and all
    assert reported == [bug]


@pytest.mark.slow  # W&B starts its service process
def test_trackers_honour_their_libraries_environment_and_recipe_keys_override_it(tmp_path, monkeypatch):
    """With MLFLOW_TRACKING_URI set, runs went to <run>/mlruns; W&B's files went to the run directory whatever
    WANDB_DIR said. Now: recipe key, else the library's variable, else scale's default."""
    from scale.trackers.sink import setting
    from tests.trackers.offline_stores import wandb_records

    lab = tmp_path / "lab_store"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", lab.resolve().as_uri())
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "lab-experiment")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_home"))
    monkeypatch.setenv("WANDB_PROJECT", "lab-project")
    monkeypatch.setenv("WANDB_MODE", "offline")
    (tmp_path / "wandb_home").mkdir()
    root = tmp_path / "run"
    RunDir(root).create()
    # online unless WANDB_MODE says; the demo recipe names its project: cleared, so that the variables apply
    cfg = load_recipe("demo/dino_tiny", ["train.trackers=[wandb,mlflow]", "train.tracker.project=''"])
    attempt(cfg, root, [1, 2])

    assert not (root / "mlruns").exists() and not (root / "wandb").exists()
    client, runs = mlflow_runs(root, lab)
    assert len(runs) == 1 and client.get_experiment(runs[0].info.experiment_id).name == "lab-experiment"
    (attempt_dir,) = (tmp_path / "wandb_home" / "wandb").glob("offline-run-*")
    projects = {r.run.project for log in attempt_dir.glob("run-*.wandb") for r in wandb_records(log) if r.run.run_id}
    assert projects == {"lab-project"}

    # a recipe key wins over the variable; an unset key and no variable: scale's default
    assert setting("mine", "WANDB_PROJECT", "dino") == "mine"
    monkeypatch.delenv("WANDB_PROJECT")
    assert setting("", "WANDB_PROJECT", "dino") == "dino"
    cfg = load_recipe("demo/dino_tiny", ["train.trackers=[mlflow]", "train.tracker.project=mine"])
    other = tmp_path / "run2"
    RunDir(other).create()
    attempt(cfg, other, [1])
    client, runs = mlflow_runs(root, lab)
    assert {client.get_experiment(r.info.experiment_id).name for r in runs} == {"lab-experiment", "mine"}


def test_closing_trackers_is_bounded_and_names_a_tracker_that_hangs(tmp_path, caplog):
    """A preempted job has Slurm's KillWait (30 s) from the signal to SIGKILL: W&B and MLflow took 47 s to shut
    down after the checkpoint. Close waits at most its timeout and names what it left running."""
    import threading

    cfg = recipe(["train.trackers=[tensorboard]"])
    RunDir(tmp_path).create()
    trackers = Trackers(cfg, tmp_path, enabled=True)
    release, closed = threading.Event(), []

    class Hanging:
        def close(self):
            release.wait(60)  # an upload to a server that does not answer

    class Quick:
        def close(self):
            closed.append(True)

    trackers.sinks = {"wandb": Hanging(), "tensorboard": Quick()}
    trackers.close(timeout=0.5)
    assert closed == [True] and not release.is_set()  # returned while the hanging close still waits
    assert "trackers: wandb did not close within" in caplog.text
    release.set()


def test_the_trackers_leave_pythons_random_stream_as_it_was(tmp_path, monkeypatch):
    """The trackers run on rank 0 only, after a resume restored its RNG, and their libraries draw from Python's
    global `random` (MLflow numbers a new experiment with it): each rank's checkpointed stream must be what the
    training made of it, or a resumed run's final rng/rank0.pt differs from the uninterrupted run's (tools/soak).
    MLflow draws only when the uuid4 it numbers an experiment from ends in a 0 digit, 1 time in 10: given one
    here. Logging and closing likewise, checked with a library that draws at every call."""
    import random
    import uuid
    from types import SimpleNamespace

    import mlflow.utils.name_utils

    import scale.trackers.tensorboard

    zeros = uuid.UUID(int=10**19 + 12345)  # its last 18 digits, MLflow's id, start with zeros: one draw each
    monkeypatch.setattr(mlflow.utils.name_utils, "uuid", SimpleNamespace(uuid4=lambda: zeros))
    drawing = scale.trackers.tensorboard.TensorBoardSink
    for method in ("log", "close"):
        real = getattr(drawing, method)
        monkeypatch.setattr(drawing, method, lambda self, *a, real=real: (random.random(), real(self, *a))[1])
    cfg = load_recipe("demo/dino_tiny", ["train.trackers=[tensorboard,mlflow]"])
    RunDir(tmp_path).create()
    random.seed(0)
    before = random.getstate()
    trackers = Trackers(cfg, tmp_path, enabled=True)  # a new MLflow experiment: its id drawn from `random`
    trackers.log(1, {"loss": 1.0})
    trackers.close(timeout=60)
    assert random.getstate() == before
    assert tensorboard_steps(tmp_path) == [1] and mlflow_runs(tmp_path)[1]  # both trackers did their work
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"  # whose thread would draw from it at any time
