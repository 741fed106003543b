"""The checkpoint's state objects, in one process: each is torch's Stateful; each lives where checkpoints have always
kept it (rng/rankN.pt, data_counters/rankN.json, monitors.pt), so old checkpoints load; the RNG restores exactly at
the same world size and reseeds at another; a checkpoint without a state leaves it fresh; a load that fails half-way
is rolled back, tensors and the engine's other state."""

import json
import random

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.stateful import Stateful

from scale.checkpoint.state import (
    ON_MAIN,
    PER_RANK,
    RankFiles,
    RngState,
    load_states,
    rolled_back,
    run_states,
    write_states,
)
from scale.engine.parallel import ParallelContext
from scale.readback import BadFile
from tests.checkpoint.test_checkpointer_state import CountingLoader
from tests.checkpoint.test_checkpointer_state import Stateful as Box


def info(rank=0, world_size=1):
    return ParallelContext(
        rank=rank, world_size=world_size, local_rank=0, master_addr="", master_port=0, launcher="single"
    )


def states(rank=0, world_size=1):
    return run_states(Box(c=1), CountingLoader(), Box(m=0), info(rank, world_size), seed=5)


def draws() -> list:
    return [random.random(), float(np.random.rand()), float(torch.rand(()))]


def test_every_state_object_is_a_torch_stateful():
    assert all(isinstance(state, Stateful) for state in states().values())
    assert set(states()) == {"method", "loader", "rng", "counters", "monitors"}


def test_the_states_are_written_where_checkpoints_always_kept_them(tmp_path):
    saved = states(rank=1, world_size=2)
    saved["counters"].loader.samples_seen = 40
    saved["monitors"].state = {"m": 3}
    write_states(saved, tmp_path, rank=1, main=False)
    write_states(states(rank=0, world_size=2), tmp_path, rank=0, main=True)
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert files == [
        "data_counters/rank0.json",
        "data_counters/rank1.json",
        "monitors.pt",
        "rng/rank0.pt",
        "rng/rank1.pt",
    ]
    assert json.loads((tmp_path / "data_counters/rank1.json").read_text())["samples"] == 40
    assert torch.load(tmp_path / "monitors.pt", weights_only=True) == {"m": 0}  # rank 0's: main writes it
    assert PER_RANK == {"rng": "rng/rank{rank}.pt", "counters": "data_counters/rank{rank}.json"}
    assert ON_MAIN == {"monitors": "monitors.pt"}


def test_the_rng_continues_exactly_at_the_same_world_size_and_reseeds_at_another(tmp_path):
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    write_states({"rng": RngState(5, 0, 1)}, tmp_path, rank=0, main=True)
    expected = draws()
    torch.manual_seed(2), np.random.seed(2), random.seed(2)
    load_states({"rng": RngState(5, 0, 1)}, tmp_path, {"world_size": 1, "step": 3})
    assert draws() == expected
    load_states({"rng": RngState(5, 0, 2)}, tmp_path, {"world_size": 1, "step": 3})  # resumed on 2 ranks
    other = draws()
    load_states({"rng": RngState(5, 0, 2)}, tmp_path, {"world_size": 1, "step": 3})
    assert draws() == other != expected  # fresh streams, reproducible


def test_a_checkpoint_older_than_a_state_leaves_it_fresh(tmp_path):
    fresh = states()
    fresh["loader"].samples_seen, fresh["monitors"].state = 7, {"m": "fresh"}
    load_states(fresh, tmp_path, {"world_size": 1, "step": 3})  # an empty folder: no counters, no monitors
    assert fresh["loader"].samples_seen == 0 and fresh["monitors"].state == {"m": "fresh"}


def test_skipped_states_are_not_read(tmp_path):
    saved = states()
    saved["loader"].samples_seen = 9
    write_states(saved, tmp_path, rank=0, main=True)
    resumed = states()
    resumed["loader"].samples_seen = 2
    load_states(resumed, tmp_path, {"world_size": 1, "step": 3}, skip=("counters",))
    assert resumed["loader"].samples_seen == 2


def test_unreadable_counters_start_at_zero_and_a_list_is_no_state(tmp_path):
    (tmp_path / "data_counters").mkdir()
    (tmp_path / "data_counters" / "rank0.json").write_text("[1, 2]")
    with pytest.raises(BadFile, match="a list, not an object"):
        RankFiles(tmp_path, PER_RANK["counters"]).get(0)
    resumed = states()
    resumed["loader"].samples_seen = 4
    load_states(resumed, tmp_path, {"world_size": 1, "step": 3})
    assert resumed["loader"].samples_seen == 0


def test_a_load_failing_half_way_is_rolled_back_with_the_engines_other_state():
    live = {"w": torch.zeros(3), "groups": [torch.ones(2)]}
    counters = {"steps": 4}

    def undo():
        counters["steps"] = 4

    with pytest.raises(RuntimeError, match="half-way"), rolled_back(live, undo):
        live["w"].copy_(torch.arange(3.0))
        live["groups"][0].fill_(7)
        counters["steps"] = 9
        raise RuntimeError("failed half-way")
    assert torch.equal(live["w"], torch.zeros(3)) and torch.equal(live["groups"][0], torch.ones(2))
    assert counters == {"steps": 4}
    with rolled_back(live, undo):  # a load that succeeds keeps what it loaded
        live["w"].fill_(5)
    assert torch.equal(live["w"], torch.full((3,), 5.0))
