"""The online linear probe leaves the backbone's training untouched (weights identical with and without it) and
logs its accuracy; the heartbeat file says the step, the phase and when the run last logged, `scale status` shows
them, and a long step shows its phase and elapsed time in the progress bar."""

import json
import time

import pytest
import torch

from scale.config import load_recipe
from scale.launch.status import run_status, summary_row
from scale.loop.step import TrainStep, read_record
from scale.loop.train import train_loader
from scale.progress import progress_bar
from scale.watch.heartbeat import Heartbeat, read_heartbeat
from tests.watch.test_collapse import TINY


def train(group, probe: bool, steps: int = 3) -> tuple[TrainStep, dict]:
    info, device = group
    cfg = load_recipe(
        "demo/dino_tiny",
        [*TINY, f"train.probe.enabled={str(probe).lower()}", "train.probe.lr=0.1", "model.drop_path=0.1"],
    )
    step = TrainStep(cfg, info, device, lambda: train_loader(cfg, info, device))
    batches = step.batches()
    for i in range(steps):
        record = step(i, step.next_batch(batches)[0])
    return step, read_record(record)


@pytest.mark.slow  # a process group
def test_the_probe_does_not_touch_the_backbone_and_logs_its_accuracy(group, embedded_data, monkeypatch):
    monkeypatch.setenv("SCALE_DATA", str(embedded_data))
    with_probe, record = train(group, probe=True)
    without, plain = train(group, probe=False)
    assert 0.0 <= record["probe_top1"] <= 100.0 and record["probe_loss"] > 0
    assert "probe_top1" not in plain
    for net in ("student", "teacher"):
        a = dict(getattr(with_probe.method, net).named_parameters())
        b = dict(getattr(without.method, net).named_parameters())
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), net
    head = with_probe.monitors.probe.head.weight
    assert head.grad is not None and not torch.equal(head, torch.zeros_like(head))
    state = with_probe.monitors.state_dict()["probe"]  # checkpointed with the monitors
    assert torch.equal(state["head"]["weight"], head)


def test_the_heartbeat_tells_status_the_step_phase_and_last_log(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 4, "time": time.time() - 30, "loss": 1.0}) + "\n")
    bar = progress_bar(total=10, desc="train")
    bar.mininterval = 0
    beat = Heartbeat(tmp_path, enabled=True, every_s=0.05, long_step_s=0.0)
    beat.bar = bar
    beat.begin_step(4)
    with beat.phase_of("backward"):
        deadline = time.time() + 30
        while (read_heartbeat(tmp_path) or {}).get("phase") != "backward" and time.time() < deadline:
            time.sleep(0.05)
        while "backward" not in bar.desc and time.time() < deadline:
            time.sleep(0.05)
    assert read_heartbeat(tmp_path)["step"] == 5
    assert bar.desc.startswith("train [step 5: backward")
    row = summary_row(run_status(tmp_path, query_slurm=False))
    assert row["phase"].startswith("backward for 00:00:0") and row["phase"].endswith("(step 5)")
    assert row["last log"] in ("00:00:30 ago", "00:00:31 ago")
    beat.begin_step(5)
    assert bar.desc == "train"  # the next step starts plain
    beat.close("preempted")
    bar.close()
    assert read_heartbeat(tmp_path)["phase"] == "preempted"
    assert summary_row(run_status(tmp_path, query_slurm=False))["phase"] == "preempted"
    assert not beat._thread.is_alive()
