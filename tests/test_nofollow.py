"""No file scale writes in a run directory is written through a symbolic link: a link to a file elsewhere (a
victim's) at the lock, metrics.jsonl, a rank's log, config.yaml, the trackers' and the checkpoints' small files is
refused with one line naming it (exit 2), and the file it points to is left as it was. In process: the writers
themselves, and the launcher's check before any rank starts."""

import logging
import threading

import pytest

from scale import nofollow
from scale.cli import main as cli
from scale.loop.rundir import RunDir, setup_logging
from scale.loop.runlock import RunLock
from scale.nofollow import LinkRefused, replacing, write_atomic
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


# The one atomic replace (scale.nofollow.replacing): whole files only, never through a link, nothing left behind.


@pytest.mark.parametrize("concurrent", [False, True])
def test_a_replace_never_writes_through_a_link_at_the_target(tmp_path, victim, concurrent):
    target = plant(tmp_path / "out" / "entry.json", victim)
    write_atomic(target, b"new bytes", concurrent=concurrent)
    assert not target.is_symlink() and target.read_bytes() == b"new bytes"


@pytest.mark.parametrize("concurrent", [False, True])
def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path, concurrent):
    target = tmp_path / "entry.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="half way"), replacing(target, concurrent=concurrent) as out:
        out.write("half of the new")
        raise RuntimeError("half way")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["entry.json"]


def test_one_writer_replaces_what_a_killed_write_left(tmp_path):
    target = tmp_path / "latest"
    (tmp_path / ".latest.tmp").write_text("a killed write's half")
    write_atomic(target, "step_2\n")
    assert target.read_text() == "step_2\n" and [p.name for p in tmp_path.iterdir()] == ["latest"]


def test_a_concurrent_writer_takes_another_name_when_its_first_is_held(tmp_path, victim, monkeypatch):
    """A planted link at a writer's random name makes it draw again (O_EXCL), never write through the link."""
    names = iter(["planted", "free"])
    monkeypatch.setattr(nofollow.secrets, "token_hex", lambda n: next(names))
    plant(tmp_path / ".entry.planted.tmp", victim)
    write_atomic(tmp_path / "entry", "mine", concurrent=True)
    assert (tmp_path / "entry").read_text() == "mine"


def test_concurrent_writers_leave_one_whole_file(tmp_path):
    """Writers replacing one file at once (the trace cache, a shard directory's indexes): every read sees one
    writer's whole file, none fails, and no temporary file is left."""
    target = tmp_path / "entry.json"
    size, rounds = 1 << 18, 30
    write_atomic(target, "x" * size)
    errors, seen = [], set()

    def writer(letter):
        try:
            for _ in range(rounds):
                write_atomic(target, letter * size, concurrent=True)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(letter,)) for letter in "abcdef"]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        text = target.read_text()
        assert len(text) == size and len(set(text)) == 1, "a reader saw half of a file"
        seen.add(text[0])
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(seen) > 1 and [p.name for p in tmp_path.iterdir()] == ["entry.json"]
