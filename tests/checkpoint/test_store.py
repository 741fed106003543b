"""Checkpoint directories: partial and damaged ones are skipped with a warning naming them, retention keeps the
last K and every M-th, a resumed run refuses a recipe whose shapes changed."""

import logging
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from scale.checkpoint.resume import check_compatible
from scale.checkpoint.store import CheckpointStore, resolve, step_name
from scale.config import load_recipe
from scale.errors import UserError


def _save(store: CheckpointStore, step: int, payload: bytes = b"x" * 100) -> None:
    staging = store.prepare(step)
    (staging / "weights.bin").write_bytes(payload)
    store.commit(step, {"engine": "fsdp2", "world_size": 2})


def test_commit_moves_latest_last_and_newest_complete_wins(tmp_path):
    store = CheckpointStore(tmp_path)
    _save(store, 10)
    _save(store, 20)
    assert (tmp_path / "latest").read_text().strip() == step_name(20)
    assert [p.name for p in store.candidates()] == [step_name(20), step_name(10)]
    assert resolve(tmp_path) == tmp_path / step_name(20)


def test_partial_write_is_ignored_and_cleaned(tmp_path):
    store = CheckpointStore(tmp_path)
    _save(store, 10)
    staging = store.prepare(20)  # killed before commit: no rename, no meta.json
    (staging / "weights.bin").write_bytes(b"half")
    assert [p.name for p in store.candidates()] == [step_name(10)]
    store.prepare(30)
    assert not staging.exists()


def test_damaged_checkpoint_is_skipped_with_a_warning_naming_it(tmp_path, caplog):
    store = CheckpointStore(tmp_path)
    _save(store, 10)
    _save(store, 20)
    (tmp_path / step_name(20) / "weights.bin").write_bytes(b"x" * 10)  # truncated after it was sealed
    with caplog.at_level(logging.WARNING):
        assert [p.name for p in store.candidates()] == [step_name(10)]
    assert step_name(20) in caplog.text and "weights.bin" in caplog.text
    (tmp_path / step_name(10) / "meta.json").unlink()
    with pytest.raises(UserError, match="no complete checkpoint"):
        resolve(tmp_path)


def test_retention_keeps_last_k_and_every_m(tmp_path):
    store = CheckpointStore(tmp_path)
    for step in range(10, 80, 10):
        _save(store, step)
    store.retain(keep_last=2, keep_every=30)
    assert sorted(p.name for p in store.step_dirs()) == [step_name(s) for s in (30, 60, 70)]


def test_resume_refuses_changed_shapes_naming_them():
    saved = load_recipe("demo/dino_tiny")
    same_shapes = load_recipe("demo/dino_tiny", ["train.epochs=20", "optim.lr=0.001", "data.workers=2"])
    check_compatible(saved, same_shapes, "runs/x")
    changed = load_recipe("demo/dino_tiny", ["model.name=vit_tiny", "method.dino.out_dim=512"])
    with pytest.raises(UserError) as err:
        check_compatible(saved, changed, "runs/x")
    assert "model.name: 'vit_nano' -> 'vit_tiny'" in str(err.value)
    assert "method.dino.out_dim: 256 -> 512" in str(err.value)
    assert OmegaConf.select(changed, "model.name") == "vit_tiny"


class Killed(BaseException):
    """Stands in for the SIGKILL of scale.faults: the commit stops where the process would die."""


@pytest.mark.parametrize("stage", ["meta", "renamed", "latest"])
def test_a_kill_at_each_stage_of_a_seal_leaves_a_checkpoint_to_resume_from(tmp_path, monkeypatch, stage):
    """SCALE_FAULT=seal@20:STAGE kills rank 0 inside the commit of step 20 (tools/soak's kill_in_seal): the newest
    checkpoint the resume finds is step 10 until the folder was renamed, step 20 after; the next save cleans up."""
    store = CheckpointStore(tmp_path)
    _save(store, 10)
    monkeypatch.setenv("SCALE_FAULT", f"seal@20:{stage}")

    def die(pid, signum):
        raise Killed

    monkeypatch.setattr("scale.faults.os.kill", die)
    with pytest.raises(Killed):
        _save(store, 20)
    expected = step_name(10) if stage == "meta" else step_name(20)
    assert resolve(tmp_path).name == expected
    assert (tmp_path / "latest").read_text().strip() == (step_name(20) if stage == "latest" else step_name(10))
    monkeypatch.delenv("SCALE_FAULT")
    _save(store, 30)
    assert [p.name for p in store.candidates()][0] == step_name(30)
    assert not store.staging_dirs() and not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def test_a_kill_inside_retention_leaves_no_half_deleted_checkpoint(tmp_path, monkeypatch):
    """A SIGKILL (or a one-rank run's Ctrl-C) while retention deletes an old checkpoint: what is left is no step
    directory (a resume would skip it as damaged, with a warning, at every start) and the next save removes it."""
    store = CheckpointStore(tmp_path)
    for step in (10, 20):
        (store.prepare(step) / "more.bin").write_bytes(b"y")  # two files: the kill comes between them
        (store.staging_dir(step) / "weights.bin").write_bytes(b"x" * 100)
        store.commit(step, {"engine": "fsdp2", "world_size": 2})
    delete = shutil.rmtree

    def killed_half_way(path, ignore_errors=False):
        files = sorted(p for p in Path(path).rglob("*") if p.is_file())
        if files:
            files[0].unlink()
            raise Killed
        delete(path, ignore_errors=ignore_errors)

    monkeypatch.setattr("scale.checkpoint.store.shutil.rmtree", killed_half_way)
    with pytest.raises(Killed):
        store.retain(keep_last=1, keep_every=0)
    monkeypatch.undo()
    assert [p.name for p in store.step_dirs()] == [step_name(20)]
    _save(store, 30)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [step_name(20), step_name(30)]
