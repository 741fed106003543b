"""Checkpointer, single process with stand-in engine, method and loader: train.async_save seals a checkpoint as soon
as its write completes; the loader's counters (data/samples, data/errors, the error budget) continue after a resume."""

import errno
import json
import shutil
import time
from collections import Counter

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from scale.checkpoint.checkpointer import Checkpointer
from scale.checkpoint.state import PER_RANK, DataCounters, RankFiles, run_states
from scale.checkpoint.store import LATEST, META, file_sizes, step_name
from scale.data.loader import Loader
from scale.engine.parallel import ParallelContext
from scale.errors import UserError


class Stateful:
    def __init__(self, **state):
        self.state, self.native_checkpoint, self.steps_per_epoch = state, False, 10
        self.kind = "ddp"  # as an engine: the kind that writes the checkpoint (meta["engine"])

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


class CountingLoader(Stateful):
    """The real Loader's counters and metrics over a stand-in position."""

    counters, load_counters, metrics = Loader.counters, Loader.load_counters, Loader.metrics

    def __init__(self):
        super().__init__(position=7)
        self.samples_seen, self.epoch_errors, self.errors, self.empty_shards = 0, 0, Counter(), 0


def checkpointer(root, weight, async_save=True, rank=0, world_size=1):
    cfg = OmegaConf.create(
        {
            "train": {"async_save": async_save, "keep_last": 2, "keep_every": 0, "seed": 0},
            "engine": {"kind": "ddp"},
            "meta": {"name": "toy"},
        }
    )
    info = ParallelContext(
        rank=rank, world_size=world_size, local_rank=0, master_addr="", master_port=0, launcher="single"
    )
    engine = Stateful(w=weight)
    states = run_states(Stateful(c=1), CountingLoader(), Stateful(m=0), info, seed=0)
    return Checkpointer(root, cfg, info, engine, states), engine


def test_async_checkpoint_is_sealed_when_its_write_completes(tmp_path):
    saver, _ = checkpointer(tmp_path, torch.arange(4.0))
    saver.save(3)
    deadline = time.monotonic() + 60  # a few KiB to write: the limit only bounds a failure
    while not (tmp_path / LATEST).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    # no next save and no close yet: sealed and resumable
    assert (tmp_path / LATEST).exists(), "the finished async save was not sealed"
    assert (tmp_path / LATEST).read_text().strip() == step_name(3) and (tmp_path / step_name(3)).is_dir()
    loader, engine = checkpointer(tmp_path, torch.zeros(4))
    assert loader.resume() == 3 and torch.equal(engine.state["w"], torch.arange(4.0))
    saver.close()


def test_resumed_run_continues_the_data_counters_and_error_budget(tmp_path):
    saver, _ = checkpointer(tmp_path, torch.arange(4.0), async_save=False)
    saver.loader.samples_seen, saver.loader.epoch_errors = 96, 3
    saver.loader.errors.update({"corrupt": 2, "truncated": 1})
    saver.save(3)
    resumed, _ = checkpointer(tmp_path, torch.zeros(4), async_save=False)
    assert resumed.resume() == 3
    assert resumed.loader.metrics() == saver.loader.metrics() and resumed.loader.epoch_errors == 3
    assert resumed.loader.metrics()["data/samples"] == 96 and resumed.loader.metrics()["data/errors"] == 3
    # another world size (2 ranks resume what 1 saved): each rank takes an even share of the saved totals
    saved = {"world_size": 1, "step": 3, "ranks": RankFiles(tmp_path / step_name(3), PER_RANK["counters"])}
    shares = [DataCounters(CountingLoader(), rank, 2).share(saved) for rank in range(2)]
    assert shares == [
        {"samples": 48, "epoch_errors": 2, "errors": {"corrupt": 1, "truncated": 1}},
        {"samples": 48, "epoch_errors": 1, "errors": {"corrupt": 1, "truncated": 0}},
    ]
    # a checkpoint written before the counters were saved: they start at 0
    folder = tmp_path / step_name(3)
    shutil.rmtree(folder / "data_counters")
    meta = json.loads((folder / META).read_text())
    (folder / META).write_text(json.dumps({**meta, "files": file_sizes(folder)}))
    old, _ = checkpointer(tmp_path, torch.zeros(4), async_save=False)
    old.loader.samples_seen = 5
    assert old.resume() == 3 and old.loader.metrics()["data/samples"] == 0 and old.loader.epoch_errors == 0


class Model(Stateful):
    """A method with a student to size (what a full disk's message compares) and no teacher."""

    teacher = None

    def __init__(self):
        super().__init__(c=1)
        self.student = torch.nn.Linear(2, 2)


@pytest.fixture
def group_of_one():
    """The checkpointer's collectives (agreement, broadcast, barrier) over a real gloo group of one rank, in this
    process."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def grouped(root, weight):
    saver, engine = checkpointer(root, weight, async_save=False)
    saver.states["method"] = saver.method = Model()
    return saver, engine


def test_a_write_failing_in_a_group_stops_the_save_and_keeps_the_previous_checkpoint(
    tmp_path, group_of_one, monkeypatch
):
    saver, _ = grouped(tmp_path, torch.arange(4.0))
    saver.save(2)

    def full_disk(obj, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr("scale.checkpoint.state.write_torch", full_disk)
    with pytest.raises(UserError, match="No space left on device"):
        saver.save(4)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [step_name(2)]  # no partial folder left
    assert [json.loads(line)["step"] for line in (tmp_path / "saves.jsonl").read_text().splitlines()] == [2]
    monkeypatch.undo()
    resumed, engine = grouped(tmp_path, torch.zeros(4))
    assert resumed.resume() == 2 and torch.equal(engine.state["w"], torch.arange(4.0))


def test_retention_in_a_group_keeps_the_newest_and_the_ones_asked_for(tmp_path, group_of_one):
    saver, _ = grouped(tmp_path, torch.arange(4.0))
    for step in (1, 2, 3, 4):
        saver.save(step)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [step_name(3), step_name(4)]  # keep_last 2


class Killed(BaseException):
    """Stands in for the SIGKILL of scale.faults: the save stops where rank 0 would die."""


def saves_lines(root) -> list[dict]:
    return [json.loads(line) for line in (root / "saves.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("stage", ["meta", "renamed", "latest"])
def test_a_seal_killed_at_any_stage_leaves_one_saves_line_per_sealed_checkpoint(tmp_path, monkeypatch, stage):
    """SCALE_FAULT=seal@4:STAGE (tools/soak's kill_in_seal): after the rename the checkpoint of step 4 is sealed
    but its saves.jsonl line was never written; the resume appends it from its meta.json, once."""
    saver, _ = checkpointer(tmp_path, torch.arange(4.0), async_save=False)
    saver.save(2)
    monkeypatch.setenv("SCALE_FAULT", f"seal@4:{stage}")

    def die(pid, signum):
        raise Killed

    monkeypatch.setattr("scale.faults.os.kill", die)
    with pytest.raises(Killed):
        saver.save(4)
    monkeypatch.undo()
    for _ in range(2):  # a second resume (killed again before its next save) adds nothing
        resumed, _ = checkpointer(tmp_path, torch.zeros(4), async_save=False)
        assert resumed.resume() == (2 if stage == "meta" else 4)
    kept = {int(p.name.split("_")[1]) for p in tmp_path.glob("step_*")}
    assert [line["step"] for line in saves_lines(tmp_path)] == sorted(kept)
    sealed = json.loads((tmp_path / step_name(max(kept)) / META).read_text())
    assert saves_lines(tmp_path)[-1]["bytes"] == sum(sealed["files"].values())
    resumed.save(6)
    assert [line["step"] for line in saves_lines(tmp_path)] == [*sorted(kept), 6]


def test_ddp_and_fsdp2_resume_each_others_checkpoints_and_deepspeeds_are_refused(tmp_path):
    """DDP and FSDP2 write the same DCP state, so a run resumes under either (an fsdp2 recipe runs as DDP on one
    rank: scale.engine.kinds.runs_as); DeepSpeed's own files are another format, refused both ways, naming both."""
    saver, engine = checkpointer(tmp_path, torch.arange(4.0), async_save=False)
    saver.cfg.engine.kind = "fsdp2"  # the recipe's kind; the engine that ran is the toy's, ddp
    saver.save(3)
    meta = json.loads((tmp_path / step_name(3) / META).read_text())
    assert (meta["engine"], meta["recipe_engine"]) == ("ddp", "fsdp2")
    for kind in ("fsdp2", "ddp"):
        resumed, engine = checkpointer(tmp_path, torch.zeros(4), async_save=False)
        engine.kind = kind
        assert resumed.resume() == 3 and torch.equal(engine.state["w"], torch.arange(4.0))
    refused, engine = checkpointer(tmp_path, torch.zeros(4), async_save=False)
    engine.kind = "deepspeed"
    with pytest.raises(UserError) as err:
        refused.resume()
    assert "written by engine 'ddp' (DCP), this run uses 'deepspeed' (DeepSpeed's own files)" in str(err.value)
    assert str(err.value).endswith("resume with engine.kind=ddp")
    (tmp_path / step_name(3) / META).write_text(json.dumps({**meta, "engine": "deepspeed"}))
    refused, engine = checkpointer(tmp_path, torch.zeros(4), async_save=False)
    with pytest.raises(
        UserError, match=r"written by engine 'deepspeed' \(DeepSpeed's own files\), this run uses 'ddp'"
    ):
        refused.resume()
