"""`scale bench` on CUDA reports the CUDA allocator's peak memory and MFU against the GPU's datasheet peak
(scale.bench.mfu, measured for GPUs it does not know), and `scale demo` finishes on one GPU."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from gpu_env import SELF_CHECK, require_cuda

from scale.bench.mfu import table_peak
from scale.demo import run_demo
from scale.launch.local import fresh_environment

pytestmark = pytest.mark.gpu

TINY_RECIPE = str(Path(__file__).parent.parent / "bench" / "tiny_dino.yaml")


def test_bench_reports_cuda_peak_memory_and_mfu_against_the_datasheet(tmp_path):
    require_cuda("CUDA peak memory")
    out = tmp_path / "rows.json"
    args = ["bench", TINY_RECIPE, "train.global_batch=16", "--synthetic-data", "--steps", "2", "--warmup", "1"]
    args += ["--matrix", "precision=fp32,bf16", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "scale.cli", *args], env=fresh_environment(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    print(proc.stdout)
    name = torch.cuda.get_device_name(0)
    rows = json.loads(out.read_text())
    # tiny_dino asks for FSDP2, which runs as DDP on one rank: the label says so after the setting
    assert [row["label"] for row in rows] == [f"precision={p} [ddp (fsdp2 on one rank)]" for p in ("fp32", "bf16")]
    for row, precision in zip(rows, ("fp32", "bf16")):
        # torch.cuda.max_memory_allocated over the step: at least the weights and optimizer state held throughout
        assert row["peak_bytes"] >= row["state"]["params"] + row["state"]["optimizer"] > 0
        assert row["rss_peak_bytes"] is None  # the CPU's resident set is not the GPU's memory
        known = table_peak(name, precision)
        if known is not None:
            assert row["peak_flops_per_device"] == known and row["peak_source"] == f"{name} datasheet ({precision})"
        else:
            assert row["peak_source"] == f"measured {precision} matmul on cuda"
        assert row["mfu"] == pytest.approx(row["flops_per_step"] / row["step_s"] / row["peak_flops_per_device"])
        assert 0 < row["mfu"] < 1


def test_demo_finishes_on_one_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    started = time.time()
    report = run_demo("dino", tmp_path, steps=6, nproc=1)
    assert report.is_file()
    rows = json.loads((tmp_path / "dino" / "bench" / "bench.json").read_text())
    # its benchmark ran where the training did: on the GPU (in the CPU self-check: the CPU)
    assert all(("on cpu" in row["peak_source"]) == SELF_CHECK for row in rows), [r["peak_source"] for r in rows]
    with capsys.disabled():
        print(
            f"\nscale demo dino, 6 steps on 1 {'CPU process' if SELF_CHECK else 'GPU'}: {time.time() - started:.0f} s"
        )
