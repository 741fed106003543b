"""A tracker store that cannot be written is one line before the ranks start (exit 2, no traceback); a tracker
that fails once training runs (its store gone, its library's error) costs that tracker's metrics, not the run:
one warning, the tracker dropped, the other trackers and metrics.jsonl keep every step. MLflow and TensorBoard
with their real packages, offline (W&B's store is checked the same way, through WANDB_DIR)."""

import json
import shutil

import pytest

from scale.cli import main as cli
from scale.config import load_recipe
from scale.errors import ConfigError
from scale.loop.rundir import RunDir
from scale.trackers import Trackers, check_stores
from tests.trackers.offline_stores import mlflow_runs
from tests.trackers.test_trackers import tensorboard_steps


@pytest.fixture
def a_file(tmp_path):
    """A regular file where a store's folder would have to be: unwritable even for root (these tests may run as
    root, whom a read-only folder's mode does not stop)."""
    path = tmp_path / "not_a_folder"
    path.write_text("")
    return path


def test_each_trackers_store_is_checked_writable(tmp_path, a_file, monkeypatch):
    root = tmp_path / "run"
    RunDir(root).create()
    cfg = load_recipe("demo/dino_tiny", ["train.trackers=[tensorboard,wandb,mlflow]"])
    check_stores(cfg, root)  # the defaults, in the run directory: created and writable
    assert (root / "mlruns").is_dir() and (root / "tensorboard").is_dir()

    mlflow = load_recipe("demo/dino_tiny", ["train.trackers=[mlflow]", f"train.tracker.tracking_uri={a_file}/mlruns"])
    with pytest.raises(ConfigError, match=rf"mlflow cannot write its store {a_file}/mlruns \(Not a directory\)"):
        check_stores(mlflow, root)
    uri = (a_file / "mlruns").as_uri()
    with pytest.raises(ConfigError, match="mlflow cannot write its store"):
        check_stores(
            load_recipe("demo/dino_tiny", ["train.trackers=[mlflow]", f"train.tracker.tracking_uri={uri}"]), root
        )
    with pytest.raises(ConfigError, match="mlflow cannot write its store"):
        sqlite = f"train.tracker.tracking_uri=sqlite:///{a_file}/runs.db"
        check_stores(load_recipe("demo/dino_tiny", ["train.trackers=[mlflow]", sqlite]), root)
    # a server is not a local store: its failures later cost its metrics only
    check_stores(
        load_recipe("demo/dino_tiny", ["train.trackers=[mlflow]", "train.tracker.tracking_uri=http://x:5000"]), root
    )

    monkeypatch.setenv("WANDB_DIR", str(a_file))
    with pytest.raises(ConfigError, match=f"wandb cannot write its store {a_file}"):
        check_stores(load_recipe("demo/dino_tiny", ["train.trackers=[wandb]"]), root)

    shutil.rmtree(root / "tensorboard")
    (root / "tensorboard").write_text("")
    with pytest.raises(ConfigError, match="tensorboard cannot write its store"):
        check_stores(load_recipe("demo/dino_tiny", ["train.trackers=[tensorboard]"]), root)


def test_scale_train_with_an_unwritable_store_exits_2_in_one_line_before_starting(tmp_path, a_file, capsys):
    run = tmp_path / "run"
    args = ["train", "demo/dino_tiny", "train.trackers=[mlflow]", f"train.tracker.tracking_uri={a_file}/mlruns"]
    code = cli([*args, "--synthetic-data", "--run-dir", str(run), "--nproc", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("cannot write its store") == 1 and "Traceback" not in err, err
    assert not (run / "metrics.jsonl").exists() and not list(run.glob("logs/rank*.log"))  # no rank started


def test_a_tracker_that_fails_later_is_dropped_with_one_warning_and_the_run_goes_on(tmp_path, caplog):
    cfg = load_recipe("demo/dino_tiny", ["train.trackers=[tensorboard,mlflow]"])
    RunDir(tmp_path).create()
    trackers = Trackers(cfg, tmp_path, enabled=True)
    trackers.log(1, {"loss": 1.0})
    client, (run,) = mlflow_runs(tmp_path)
    shutil.rmtree(tmp_path / "mlruns")  # the store gone (an unmounted or full file system, a deleted folder)
    (tmp_path / "mlruns").write_text("")
    with caplog.at_level("WARNING", logger="scale.trackers"):
        for step in (2, 3, 4):
            trackers.log(step, {"loss": 1.0 / step})
        trackers.close(timeout=60)
    warned = [r.getMessage() for r in caplog.records if "goes on without it" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("trackers: mlflow failed logging step 2 ("), warned
    assert list(trackers.sinks) == ["tensorboard"]
    assert tensorboard_steps(tmp_path) == [1, 2, 3, 4]
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert json.loads((tmp_path / "trackers.json").read_text())["last_step"] == 4


def test_a_tracker_that_cannot_open_its_run_is_left_out_with_one_warning(tmp_path, a_file, caplog):
    """A store that turned unwritable between the launcher's check and rank 0's start (or a server that refuses)."""
    overrides = ["train.trackers=[tensorboard,mlflow]", f"train.tracker.tracking_uri={a_file}/mlruns"]
    RunDir(tmp_path).create()
    with caplog.at_level("WARNING", logger="scale.trackers"):
        trackers = Trackers(load_recipe("demo/dino_tiny", overrides), tmp_path, enabled=True)
        trackers.log(1, {"loss": 1.0})
        trackers.close(timeout=60)
    warned = [r.getMessage() for r in caplog.records if "goes on without it" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("trackers: mlflow failed opening its run ("), warned
    assert tensorboard_steps(tmp_path) == [1]
