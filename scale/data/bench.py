"""Throughput of the view pipeline on shards against the official DINO augmentation, on the same images and cores.

`bench_dali` measures the DALI backend (data.backend=dali) on the same shards beside them: its loader, with
data.workers threads, reading the tars (page-cached after the first pass) on the GPU when there is one, else on the
CPU; the first batch (pipeline build and prefetch) is not counted.

Both read the same JPEG bytes (held in memory, so the disk is out of the measurement) and run in the same worker
processes, alternating on chunks of `batch` images so that both see the same load from anything else running on the
machine; crops/s counts every crop produced (ours: the recipe's views, collated and normalised as the loader does;
reference: 2 x 224 + n_local x 96). Images/s are wall-clock; the CPU-time ratio is the per-core speedup, which other
processes competing for the cores do not distort.
"""

import random
import time
from multiprocessing import get_context
from pathlib import Path

import torch

from scale.data.factory import build_loader
from scale.data.loader import ShardReader, collate
from scale.data.reference import ReferenceDino
from scale.data.shards import read_manifest
from scale.data.views import build_views
from scale.extras import available


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


def _run(args) -> dict:
    """One worker: ours and the reference alternate on chunks of images; wall and CPU seconds and crops of each."""
    views_cfg, jpegs, batch, n_local = args
    torch.set_num_threads(1)
    views = build_views(views_cfg)
    rng = random.Random(0)
    random.seed(0)
    torch.manual_seed(0)
    reference = ReferenceDino(n_local=n_local)

    def ours(chunk):
        samples = [(str(n), views(data, rng), -1) for n, data in enumerate(chunk)]
        collate(samples, views, views_cfg.mean, views_cfg.std, "none", 0)
        return sum(views.views_per_group) * len(chunk)

    def ref(chunk):
        return sum(len(reference(data)) for data in chunk)

    out = {name: {"wall": 0.0, "cpu": 0.0, "crops": 0} for name in ("ours", "reference")}
    for i in range(0, len(jpegs), batch):
        for name, run in (("ours", ours), ("reference", ref)):
            wall, cpu = time.perf_counter(), time.process_time()
            out[name]["crops"] += run(jpegs[i : i + batch])
            out[name]["wall"] += time.perf_counter() - wall
            out[name]["cpu"] += time.process_time() - cpu
    return out


def _parallel(jobs: list) -> list[dict]:
    """Run the jobs at once, one process each (process start-up not counted)."""
    if len(jobs) == 1:
        return [_run(jobs[0])]
    with get_context("spawn").Pool(len(jobs)) as pool:
        return pool.map(_run, jobs)


def bench_views(
    views_cfg, shard_dir, workers: int = 1, images: int = 200, batch: int = 32, ref_n_local: int = 10
) -> dict:
    jpegs = load_jpegs(shard_dir, images)
    parts = [jpegs[w::workers] for w in range(workers)]
    results = _parallel([(views_cfg, p, batch, ref_n_local) for p in parts])
    n = len(jpegs)
    out = {"images": n, "workers": workers}
    for name in ("ours", "reference"):
        wall = max(r[name]["wall"] for r in results)  # the slowest worker sets the pace
        out[f"{name}_images_per_s"] = n / wall
        out[f"{name}_crops_per_s"] = sum(r[name]["crops"] for r in results) / wall
        out[f"{name}_cpu_s"] = sum(r[name]["cpu"] for r in results)
    out["speedup"] = out["ours_images_per_s"] / out["reference_images_per_s"]
    out["speedup_per_core"] = out["reference_cpu_s"] / out["ours_cpu_s"]
    return out


def dali_available() -> bool:
    return available("nvidia.dali")


def bench_dali(
    views_cfg, shard_dir, workers: int = 1, images: int = 200, batch: int = 32, device: str = "auto"
) -> dict:
    """Images/s, crops/s and CPU seconds of the DALI loader over `images` samples (after one warm-up batch)."""
    from omegaconf import OmegaConf

    from scale.data.config import DataConfig

    cfg = OmegaConf.structured(
        DataConfig(train=str(shard_dir), val=str(shard_dir), backend="dali", dali_device=device, workers=workers)
    )
    cfg.views = views_cfg
    total = read_manifest(shard_dir)["num_samples"]
    steps = max(1, min(images, total) // batch - 1)
    loader = build_loader(cfg, "train", batch, 0, 1, seed=0, samples_per_epoch=(steps + 1) * batch)
    batches = iter(loader)
    next(batches)
    wall, cpu = time.perf_counter(), time.process_time()
    crops = sum(sum(c.shape[0] for c in b.crops) for b in batches)
    if loader.device == "gpu":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "images": steps * batch,
        "device": loader.device,
        "images_per_s": steps * batch / wall,
        "crops_per_s": crops / wall,
        "cpu_s": cpu,
    }
