"""Throughput of the view pipelines on shards against the official DINO augmentation, on the same images and cores:
the official pipeline, scale's CPU views (photometric_on=cpu), the CPU part of the split pipeline
(photometric_on=device: decode, crop, resize, draw), and, apart, the split pipeline's device part.

`bench_dali` measures the DALI backend (data.backend=dali) on the same shards beside them: its loader, with
data.workers threads, reading the tars (page-cached after the first pass) on the GPU when there is one, else on the
CPU; the first batch (pipeline build and prefetch) is not counted.

All read the same JPEG bytes (held in memory, so the disk is out of the measurement) and run in the same worker
processes, alternating on chunks of `batch` images so that all see the same load from anything else running on the
machine; crops/s counts every crop produced (ours: the recipe's views, collated and normalised as the loader does;
reference: the recipe's crop sizes, scales and counts, multicrop's first local size). Images/s are wall-clock; images per CPU second are the per-core rates, which
other processes competing for the cores do not distort.
"""

import random
import time
from multiprocessing import get_context
from pathlib import Path

import torch

from scale.data.factory import build_loader
from scale.data.loader import ShardReader, collate
from scale.data.photometric import Photometric
from scale.data.reference import ReferenceDino
from scale.data.shards.read import read_manifest
from scale.data.spec import LoaderSpec
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


PIPELINES = {  # name -> what `scale bench data` calls it
    "reference": "official DINO (PIL, full decode)",  # the same crops (reference_for)
    "cpu": "scale, photometric_on=cpu",
    "split": "scale, photometric_on=device: CPU part",
}


def _run(args) -> dict:
    """One worker: the pipelines alternate on chunks of images; wall and CPU seconds and crops of each."""
    views_cfg, jpegs, batch = args
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a loader worker; put back for the caller when run in its process
    try:
        return _alternate(views_cfg, jpegs, batch)
    finally:
        torch.set_num_threads(threads)


def reference_for(views_cfg) -> ReferenceDino:
    """The official DINO pipeline making the recipe's crops (two_view: the two global crops only)."""
    n_local = sum(views_cfg.n_local) if views_cfg.kind == "multicrop" else 0
    scales = tuple(views_cfg.global_scale), tuple(views_cfg.local_scale)
    return ReferenceDino(views_cfg.global_size, views_cfg.local_sizes[0], n_local, *scales)


def _alternate(views_cfg, jpegs: list, batch: int) -> dict:
    random.seed(0)
    torch.manual_seed(0)
    reference = reference_for(views_cfg)

    def scale_views(photometric_on: str):
        views, rng = build_views(views_cfg, photometric_on), random.Random(0)

        def run(chunk):
            samples = [(str(n), views(data, rng), -1) for n, data in enumerate(chunk)]
            collate(samples, views, views_cfg.mean, views_cfg.std, "none", 0)
            return sum(views.views_per_group) * len(chunk)

        return run

    runs = {
        "reference": lambda chunk: sum(len(reference(data)) for data in chunk),
        "cpu": scale_views("cpu"),
        "split": scale_views("device"),
    }
    out = {name: {"wall": 0.0, "cpu": 0.0, "crops": 0} for name in runs}
    for i in range(0, len(jpegs), batch):
        for name, run in runs.items():
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


def bench_views(views_cfg, shard_dir, workers: int = 1, images: int = 200, batch: int = 32) -> dict:
    """Per pipeline (PIPELINES): images/s and crops/s on `workers` processes (wall clock: the slowest worker sets
    the pace), CPU seconds, and images/s per core (images per CPU second, which other load does not distort)."""
    jpegs = load_jpegs(shard_dir, images)
    parts = [jpegs[w::workers] for w in range(workers)]
    results = _parallel([(views_cfg, p, batch) for p in parts])
    n = len(jpegs)
    out = {"images": n, "workers": workers}
    for name in PIPELINES:
        wall = max(r[name]["wall"] for r in results)
        cpu = sum(r[name]["cpu"] for r in results)
        crops = sum(r[name]["crops"] for r in results)
        out[name] = {"images_per_s": n / wall, "crops_per_s": crops / wall, "cpu_s": cpu, "per_core": n / cpu}
    return out


def bench_device(views_cfg, batch: int = 64, steps: int = 10, device: torch.device | None = None) -> dict:
    """Images/s of the device part (Photometric.apply) on batches of `batch` images in the recipe's crop layout,
    with parameters drawn as the loader draws them; on CUDA when there is one, else on the CPU (all its threads)."""
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    views, rng = build_views(views_cfg, "device"), random.Random(0)
    specs = [spec for group in views.groups for spec in group]
    rows = [[views.draw(spec, rng).row() for _ in range(batch)] for spec in specs]
    crops, params, row = [], [], 0
    for group in views.groups:
        size = group[0].size
        crops.append(torch.randint(0, 256, (len(group) * batch, 3, size, size), dtype=torch.uint8, device=device))
        params.append([r for spec_rows in rows[row : row + len(group)] for r in spec_rows])
        row += len(group)
    photometric = Photometric.of(params, views_cfg.mean, views_cfg.std, views.blur_taps).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    photometric.apply(crops)  # warm-up: kernels, allocator
    sync()
    wall = time.perf_counter()
    for _ in range(steps):
        photometric.apply(crops)
    sync()
    wall = time.perf_counter() - wall
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    return {"device": name, "images_per_s": batch * steps / wall, "batch": batch}


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
    loader = build_loader(LoaderSpec(cfg, "train", batch, 0, 1, seed=0, samples_per_epoch=(steps + 1) * batch))
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
