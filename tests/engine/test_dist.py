"""Distributed bootstrap and teardown: one code path for torchrun, Slurm srun and one process (2 gloo processes)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scale.engine.dist import detect, first_host, free_port

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

WORKER = str(Path(__file__).with_name("allreduce_worker.py"))
SHUTDOWN_WORKER = str(Path(__file__).with_name("shutdown_worker.py"))


def _clean_env() -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))
    }
    env["OMP_NUM_THREADS"] = "1"
    return env


def _results(outputs: list[str]) -> list[dict]:
    rows = [json.loads(line) for out in outputs for line in out.splitlines() if line.startswith("{")]
    return sorted(rows, key=lambda r: r["rank"])


def _torchrun(script: str, *args: str) -> subprocess.CompletedProcess:
    torchrun = Path(sys.executable).with_name("torchrun")
    return subprocess.run(
        [str(torchrun), "--nproc_per_node=2", f"--master_port={free_port()}", script, *args],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_torchrun_two_gloo_processes_all_reduce():
    out = _torchrun(WORKER)
    assert out.returncode == 0, out.stderr
    rows = _results([out.stdout])
    assert [r["rank"] for r in rows] == [0, 1]
    assert all(r["sum"] == 3.0 and r["world"] == 2 and r["launcher"] == "torchrun" for r in rows)
    assert all(r["backend"] == "gloo" for r in rows)


def test_faked_slurm_two_processes_all_reduce():
    procs = []
    for rank in range(2):
        env = _clean_env()
        env.update(
            SLURM_PROCID=str(rank),
            SLURM_NTASKS="2",
            SLURM_LOCALID=str(rank),
            SLURM_JOB_NODELIST="localhost",
            SLURM_JOB_ID="4242",
            MASTER_PORT=str(free_port()) if rank == 0 else "",
        )
        procs.append(env)
    procs[1]["MASTER_PORT"] = procs[0]["MASTER_PORT"]
    running = [
        subprocess.Popen([sys.executable, WORKER], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for env in procs
    ]
    outputs = [p.communicate(timeout=120) for p in running]
    assert all(p.returncode == 0 for p in running), [err for _, err in outputs]
    rows = _results([out for out, _ in outputs])
    assert [(r["rank"], r["local_rank"], r["launcher"], r["sum"]) for r in rows] == [
        (0, 0, "slurm", 3.0),
        (1, 1, "slurm", 3.0),
    ]


def test_detect_prefers_torchrun_then_slurm_then_single():
    torchrun = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "1234",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
    }
    info = detect(torchrun)
    assert (info.rank, info.world_size, info.local_rank, info.master_addr, info.launcher) == (3, 8, 1, "n1", "torchrun")
    slurm = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "16",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "gpu[003-004]",
    }
    info = detect(slurm)
    assert (info.rank, info.world_size, info.local_rank, info.launcher) == (5, 16, 1, "slurm")
    assert info.master_addr == "gpu003" and info.master_port == 20077
    single = detect({})
    assert (single.rank, single.world_size, single.launcher) == (0, 1, "single")


def test_first_host_of_node_lists():
    assert first_host("node17") == "node17"
    assert first_host("gpu[010-012,020]") == "gpu010"
    assert first_host("a[1,3],b2") == "a1"


def test_shutdown_waits_for_the_peer_on_success(tmp_path):
    out = _torchrun(SHUTDOWN_WORKER, "success", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert [r["peer_done_at_exit"] for r in _results([out.stdout])] == [True, True]


def test_shutdown_does_not_wait_while_an_exception_propagates(tmp_path):
    out = _torchrun(SHUTDOWN_WORKER, "failure", str(tmp_path))
    rows = _results([out.stdout])
    assert rows and rows[0] == {"rank": 0, "peer_left": True}, out.stderr
