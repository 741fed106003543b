"""Quiet by default (issue 36): a real recipe's `scale train` prints no library warning (the DataLoader worker
count follows the CPUs available to the rank; DeepSpeed's accelerator is chosen before its import and its noise
quieted once), `scale ckpt info` starts with the checkpoint, `-v` shows what was quieted; and
`scale train --synthetic-data` runs without any data."""

import logging
import os
import subprocess

import pytest

from scale.cli import main
from scale.data import loader as data_loader
from scale.engine.deepspeed import choose_accelerator
from scale.launch.local import fresh_environment
from tests.helpers_run import run_scale, run_train

# dino/table2/vit_s16 as it is (data.workers=4, fsdp2, bf16) but tiny: the embedded digits, vit_nano, 2 steps
TINY_REAL = [
    "data.views.global_size=32",
    "data.views.local_sizes=[16]",
    "data.views.n_local=[2]",
    "data.shuffle_buffer=16",
    "model.name=vit_nano",
    "model.img_size=32",
    "method.dino.out_dim=64",
    "method.dino.hidden_dim=32",
    "method.dino.bottleneck_dim=16",
    "train.global_batch=8",
    "train.samples_per_epoch=16",
    "train.max_steps=2",
]
NOISE = ("Warning", "worker processes", "No CUDA runtime", "Setting accelerator", "[WARNING]")


def test_workers_capped_by_the_cpus_of_the_rank_and_said_once(monkeypatch, caplog):
    monkeypatch.setattr(data_loader, "available_cpus", lambda: 2)
    monkeypatch.setattr(data_loader, "_said_workers", set())
    with caplog.at_level(logging.INFO, logger="scale.data.loader"):
        assert data_loader.worker_count(4, "train loader") == 2
        assert data_loader.worker_count(4, "train loader") == 2
        assert data_loader.worker_count(1, "train loader") == 1
        assert data_loader.worker_count(0, "train loader") == 0
    assert [r.getMessage() for r in caplog.records] == [
        "data.workers=4 but 2 CPU(s) available to this process (train loader): using 2"
    ]
    assert data_loader.available_cpus() >= 1


def test_deepspeed_accelerator_chosen_before_import(monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    choose_accelerator("cpu")
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    monkeypatch.delenv("DS_ACCELERATOR")
    choose_accelerator("cuda")  # never on a GPU machine: DeepSpeed detects it
    assert "DS_ACCELERATOR" not in os.environ


def _scale(args: list[str], data_root, timeout: int = 600, fork: bool = False) -> subprocess.CompletedProcess:
    """`scale ARGS` as a user runs it: new interpreters. `fork`: the launcher and its ranks forked from the preloaded
    fork server (tests/helpers_run.py), with a fresh interpreter's warning filters and DeepSpeed imported by the
    ranks as ever: for a check of what reaches the ranks, not of what an interpreter's start-up prints."""
    # no PYTHONWARNINGS=ignore here (tests.helpers_run sets it): the point is what a user sees
    env = dict(fresh_environment(), SCALE_DATA=str(data_root), OMP_NUM_THREADS="1")
    env.pop("PYTHONWARNINGS", None)
    env.pop("SCALE_VERBOSE", None)
    return run_scale(args, env, fork=fork, timeout=timeout)


def _data(root) -> list[str]:
    digits = root / "embedded" / "digits"
    return [f"data.train={digits / 'train'}", f"data.val={digits / 'val'}"]


@pytest.mark.slow
@pytest.mark.parametrize("engine", [[], ["engine.kind=deepspeed", "engine.zero_stage=2", "engine.precision=fp32"]])
def test_real_recipe_trains_quietly(embedded_data, tmp_path, engine):
    run = tmp_path / "run"
    args = ["train", "dino/table2/vit_s16", *TINY_REAL, *_data(embedded_data), *engine, "--run-dir", str(run)]
    out = _scale([*args, "--nproc", "2"], embedded_data)
    assert out.returncode == 0, out.stderr[-3000:]
    assert not [w for w in NOISE if w in out.stderr], out.stderr[-3000:]
    assert "data.workers=4 but" in out.stderr or (os.cpu_count() or 1) >= 4  # the cap, said once
    info = _scale(["ckpt", "info", str(run)], embedded_data)
    assert info.returncode == 0 and info.stdout.splitlines()[0].startswith("checkpoint ") and not info.stderr
    if engine:  # -v shows what was quieted: what reaches the ranks, not an interpreter's start-up (above), so forked
        out = _scale(["-v", *args, "train.max_steps=3", "--nproc", "2"], embedded_data, fork=True)
        assert out.returncode == 0 and "FutureWarning" in out.stderr, out.stderr[-3000:]


@pytest.mark.slow
def test_train_synthetic_data_needs_no_data(tmp_path, monkeypatch, capsys):
    """What is tested is the data, not the start-up of a process: the refusal is checked in this process and the
    run forked from the preloaded launcher (tests/helpers_run.py); the launches above see what a user sees."""
    monkeypatch.setenv("SCALE_DATA", str(tmp_path))
    run = tmp_path / "run"
    recipe, overrides = "dino/table2/vit_s16", [*TINY_REAL, "data.train=/no/such/shards"]
    assert main(["train", recipe, *overrides, "--run-dir", str(run)]) == 2
    assert "data.train=/no/such/shards: no such directory" in capsys.readouterr().err
    out = run_train(tmp_path, run, [*overrides, "--synthetic-data"], recipe=recipe)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "synthetic data" in out.stderr
    assert (run / "metrics.jsonl").read_text().count("\n") >= 1
    assert list((run / "checkpoints").glob("step_*"))
