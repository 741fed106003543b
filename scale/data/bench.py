"""Throughput of the view pipeline on shards against the official DINO augmentation, on the same images and cores.

Both read the same JPEG bytes (held in memory, so the disk is out of the measurement) and run with the same number
of worker processes; crops/s counts every crop produced (ours: the recipe's views; reference: 2 x 224 + 10 x 96).
"""

import random
import time
from multiprocessing import get_context
from pathlib import Path

import torch

from scale.data.loader import ShardReader, collate
from scale.data.reference import ReferenceDino
from scale.data.shards import read_manifest
from scale.data.views import build_views


def load_jpegs(shard_dir, limit: int) -> list[bytes]:
    shard_dir = Path(shard_dir)
    manifest = read_manifest(shard_dir)
    reader = ShardReader(shard_dir, manifest)
    out = []
    for shard, count in enumerate(s["count"] for s in manifest["shards"]):
        for i in range(count):
            out.append(reader.read(shard, i)[1])
            if len(out) == limit:
                return out
    return out


def _run_ours(args) -> tuple[float, int]:
    views_cfg, jpegs, batch = args
    torch.set_num_threads(1)
    views = build_views(views_cfg)
    rng = random.Random(0)
    start = time.perf_counter()
    for i in range(0, len(jpegs), batch):
        samples = [(str(n), views(data, rng), -1) for n, data in enumerate(jpegs[i:i + batch])]
        collate(samples, views, views_cfg.mean, views_cfg.std, "none", 0)
    return time.perf_counter() - start, sum(views.views_per_group) * len(jpegs)


def _run_reference(args) -> tuple[float, int]:
    jpegs, n_local = args
    torch.set_num_threads(1)
    random.seed(0)
    torch.manual_seed(0)
    ref = ReferenceDino(n_local=n_local)
    start = time.perf_counter()
    for data in jpegs:
        ref(data)
    return time.perf_counter() - start, (2 + n_local) * len(jpegs)


def _parallel(fn, jobs: list) -> tuple[float, int]:
    """Time of the slowest of the jobs run at once, one process each (process start-up not counted), and crops."""
    if len(jobs) == 1:
        results = [fn(jobs[0])]
    else:
        with get_context("spawn").Pool(len(jobs)) as pool:
            results = pool.map(fn, jobs)
    return max(r[0] for r in results), sum(r[1] for r in results)


def bench_views(views_cfg, shard_dir, workers: int = 1, images: int = 200, batch: int = 32,
                ref_n_local: int = 10) -> dict:
    jpegs = load_jpegs(shard_dir, images)
    parts = [jpegs[w::workers] for w in range(workers)]
    ours_s, ours_crops = _parallel(_run_ours, [(views_cfg, p, batch) for p in parts])
    ref_s, ref_crops = _parallel(_run_reference, [(p, ref_n_local) for p in parts])
    n = len(jpegs)
    return {"images": n, "workers": workers,
            "ours_images_per_s": n / ours_s, "ours_crops_per_s": ours_crops / ours_s,
            "reference_images_per_s": n / ref_s, "reference_crops_per_s": ref_crops / ref_s,
            "speedup": ref_s / ours_s}
