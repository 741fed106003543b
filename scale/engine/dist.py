"""Distributed bootstrap, one code path for torchrun, Slurm srun and a plain single process.

torchrun sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT; srun sets SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID
and the node list, from whose first host we take the master address. With neither, we are one process.
"""

import datetime
import os
import random
import re
import socket
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str  # torchrun | slurm | single

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: 'gpu[003-005,010],cpu1' -> 'gpu003'."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.split()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    match = re.match(r"([^\[,]+)(?:\[([^\]]+)\])?", nodelist)
    if not match:
        raise ValueError(f"cannot parse SLURM_JOB_NODELIST '{nodelist}'")
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def slurm_port(job_id: str) -> int:
    """A port derived from the job id, so that concurrent jobs on one node do not collide."""
    return 20000 + int(job_id) % 20000 if job_id.isdigit() else DEFAULT_PORT


def detect(env: dict | None = None) -> DistInfo:
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistInfo(
            int(env["RANK"]),
            int(env["WORLD_SIZE"]),
            int(env.get("LOCAL_RANK", 0)),
            env.get("MASTER_ADDR", "127.0.0.1"),
            int(env.get("MASTER_PORT", DEFAULT_PORT)),
            "torchrun",
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"
        addr = env.get("MASTER_ADDR") or first_host(nodelist)
        port = int(env.get("MASTER_PORT") or slurm_port(env.get("SLURM_JOB_ID", "")))
        return DistInfo(
            int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0)), addr, port, "slurm"
        )
    return DistInfo(0, 1, 0, "127.0.0.1", free_port(), "single")


def free_port() -> int:
    """A free local port, so that several single-process runs on one machine do not collide."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def device_for(info: DistInfo) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", info.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_distributed(timeout_minutes: int = 30) -> tuple[DistInfo, torch.device]:
    """Join the process group (nccl on CUDA, gloo on CPU). A single process still gets a group of one, so that
    every engine and collective runs the same code at any world size."""
    info = detect()
    device = device_for(info)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # exported so that libraries that read the environment (DeepSpeed, DCP) agree with us; shutdown() takes
        # back what we added, so that a later launch from this process does not think it is already launched
        exported = dict(
            RANK=str(info.rank),
            WORLD_SIZE=str(info.world_size),
            LOCAL_RANK=str(info.local_rank),
            MASTER_ADDR=info.master_addr,
            MASTER_PORT=str(info.master_port),
        )
        _EXPORTED.update({k: os.environ.get(k) for k in exported})
        os.environ.update(exported)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method=f"tcp://{info.master_addr}:{info.master_port}",
            rank=info.rank,
            world_size=info.world_size,
            timeout=datetime.timedelta(minutes=timeout_minutes),
        )
    return info, device


def seed_everything(seed: int, rank: int) -> None:
    """Different streams per rank (augmentations differ), reproducible per (seed, rank)."""
    s = seed + rank
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)


_EXPORTED: dict[str, str | None] = {}  # variable -> its value before init_distributed set it


def shutdown() -> None:
    """Leave the process group. On the success path every rank first waits for the others: a gloo rank that tears
    down while a peer still works (rank 0 writing results) can abort with SIGABRT. Called from a `finally` while
    an exception propagates, it does not wait, as a failed peer may never arrive (the launcher stops the others)."""
    if dist.is_initialized():
        if sys.exc_info()[0] is None:
            dist.barrier()
        dist.destroy_process_group()
    for key, before in _EXPORTED.items():
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
    _EXPORTED.clear()
