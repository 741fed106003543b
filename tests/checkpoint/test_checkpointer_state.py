"""Checkpointer, single process with stand-in engine, method and loader: train.async_save seals a checkpoint as soon
as its write completes."""

import time

import torch
from omegaconf import OmegaConf

from scale.checkpoint.checkpointer import Checkpointer
from scale.checkpoint.store import LATEST, step_name
from scale.engine.dist import DistInfo


class Stateful:
    def __init__(self, **state):
        self.state, self.native_checkpoint, self.steps_per_epoch = state, False, 10

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


def checkpointer(root, weight, async_save=True, rank=0, world_size=1):
    cfg = OmegaConf.create(
        {
            "train": {"async_save": async_save, "keep_last": 2, "keep_every": 0, "seed": 0},
            "engine": {"kind": "ddp"},
            "meta": {"name": "toy"},
        }
    )
    info = DistInfo(rank=rank, world_size=world_size, local_rank=0, master_addr="", master_port=0, launcher="single")
    engine = Stateful(w=weight)
    return Checkpointer(root, cfg, info, engine, Stateful(c=1), Stateful(position=7), Stateful(m=0)), engine


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
