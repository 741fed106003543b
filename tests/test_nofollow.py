"""No file scale writes in a run directory is written through a symbolic link: a link to a file elsewhere (a
victim's) at the lock, metrics.jsonl, a rank's log, config.yaml, the trackers' and the checkpoints' small files is
refused with one line naming it (exit 2), and the file it points to is left as it was. In process: the writers
themselves, and the launcher's check before any rank starts."""

import logging

import pytest

from scale.cli import main as cli
from scale.loop.rundir import RunDir, setup_logging
from scale.loop.runlock import RunLock
from scale.nofollow import LinkRefused
from scale.trackers.jsonl import JsonlSink

VICTIM_TEXT = "someone else's file\n"


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "elsewhere" / "thesis.tex"
    path.parent.mkdir()
    path.write_text(VICTIM_TEXT)
    yield path
    assert path.read_text() == VICTIM_TEXT  # never truncated, appended to or replaced


@pytest.fixture
def run(tmp_path):
    return RunDir(tmp_path / "run").create()


def plant(link, victim):
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim)
    return link


def test_lock_through_a_link_is_refused(run, victim):
    plant(run.root / ".lock", victim)
    with pytest.raises(LinkRefused, match=r"\.lock: a symbolic link"):
        RunLock(run.root).acquire()


def test_metrics_through_a_link_are_refused(run, victim):
    plant(run.metrics, victim)
    with pytest.raises(LinkRefused, match="metrics.jsonl"):
        JsonlSink(run.metrics)


def test_rank_log_through_a_link_is_refused(run, victim):
    plant(run.logs / "rank1.log", victim)
    try:
        with pytest.raises(LinkRefused, match="rank1.log"):
            setup_logging(run, 1)
    finally:
        logging.getLogger().handlers.clear()


def test_rewritten_files_replace_a_link_never_write_through_it(run, victim):
    """config.yaml, checkpoints/latest, trackers.json, a result JSON: a link at the name or at any temporary name
    beside it is replaced by the new file, the file it points to untouched."""
    from omegaconf import OmegaConf

    from scale.checkpoint.store import write_latest
    from scale.loop.rundir import write_json
    from scale.trackers import TrackerState

    trackers = TrackerState(run.root)  # read before the links are planted
    targets = [run.config, run.checkpoints / "latest", run.root / "trackers.json", run.root / "result.json"]
    for path in targets:  # the name, and the temporary names a writer might use
        for name in {path.name, f"{path.name}.tmp", f".{path.name}.tmp", f"{path.stem}.tmp"}:
            plant(path.parent / name, victim)
    run.write_config(OmegaConf.create({"a": 1}))
    write_latest(run.checkpoints, "step_000000002")  # commit's and set_aside's writer
    trackers.save()
    write_json(run.root / "result.json", {"top1": 1.0})
    assert all(path.is_file() and not path.is_symlink() for path in targets)


@pytest.mark.parametrize("name", [".lock", "metrics.jsonl", "logs/rank0.log", "checkpoints/saves.jsonl"])
def test_train_refuses_a_link_in_its_run_dir_before_starting(run, victim, capsys, name):
    plant(run.root / name, victim)
    assert cli(["train", "demo/dino_tiny", "--run-dir", str(run.root), "--synthetic-data", "train.max_steps=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("scale: error:") == 1 and "symbolic link" in err and name in err, err
    assert "Traceback" not in err
