"""The reference run of the resume, fault and chaos tests (6 steps of the demo recipe on 2 ranks, a checkpoint
every 2 steps, the monitors every step) and how runs are compared with it."""

import json

import torch

from scale.checkpoint.export import read_tensors
from scale.checkpoint.store import resolve
from tests.helpers_run import TINY

STEPS = 6
# the monitors every step: a resumed run must report what the uninterrupted one did (their state is checkpointed)
COMMON = TINY + [
    "train.ckpt_every_steps=2",
    "model.drop_path=0.1",
    "train.keep_last=10",
    "train.knn_monitor_every=1",
    "train.grad_monitor_every=1",
]
OVERRIDES = COMMON + [f"train.max_steps={STEPS}"]
MONITORED = ("knn_monitor_top1", "grad_norm_max_layer", "data/samples", "data/errors")


def metric(run_dir, key: str = "loss") -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row[key] for row in rows if key in row}


def losses(run_dir) -> dict[int, float]:
    return metric(run_dir)


def final_state(run_dir) -> dict[str, torch.Tensor]:
    return read_tensors(resolve(run_dir), "")


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"tensors differ after resume: {different[:5]}"
