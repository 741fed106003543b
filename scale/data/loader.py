"""Resumable, rank-split loaders over shard directories, built from a `LoaderSpec` (scale/data/spec.py); they yield
`scale.data.batch.Batch`.

Position. A loader's position is the GLOBAL number of samples consumed since the start of training (a multiple of
global_batch). Every rank runs steps_per_epoch = samples_per_epoch // global_batch steps per epoch, whatever the
shard sizes, so no collective waits on a rank that ran out of data. Each rank gets global_batch // world_size
samples per step (global_batch must divide by world_size). `state_dict()` is {"position", ...}; `load_state_dict`
restores it. One `iter(loader)` runs the rest of the current epoch; the next one starts the next epoch.

Mode `epochs` (exact). The order of epoch e is a function of (seed, e) over the GLOBAL sample index only: shards in
a random order, their samples concatenated, then each consecutive window of `shuffle_buffer` samples permuted (a
shuffle buffer with a fixed seed, keeping reads local). Global step s takes positions [s*G, (s+1)*G) of that order
and rank r takes its slice [s*G + r*b, s*G + (r+1)*b) with b = G / world_size. Samples are read by position from
the tars through their member index (`shard-N.idx`, or a scan of the tar). Guarantees: within an epoch every
sample appears at most once and steps_per_epoch*G distinct samples are used (the tail of the order, fewer than G
samples, varies by epoch and is dropped); after load_state_dict(position) the run continues with exactly the
global batches an uninterrupted run would have produced (no repeat, no skip), for ANY new world size and number of
workers, as long as seed, global_batch, samples_per_epoch and the shards are unchanged. A sample's augmentation is
drawn from a generator seeded by (seed, epoch, position), so resumed batches are identical tensor for tensor.

Repeated augmentation (data.repeated_aug = k > 1, training split; DeiT's RASampler, samplers.py): position p of
the epoch reads entry repeated_slot(p) of the list that repeats each position of the order above k times, so
about samples_per_epoch / k images are read per epoch, k times each with independent augmentations, and the k
copies of an image fall in the same global batch (but where k does not divide global_batch: an image at the edge
spans two) on different ranks, as in DeiT. The order is still a function of
(seed, epoch, global position): the guarantees above (rank split, exact resume at any world size) hold unchanged.

Mode `resampled` (infinite stream). A webdataset pipeline per (rank, worker): shards drawn with replacement
(ResampledShards), a shuffle buffer, decode and views. Each stream is seeded by (seed, rank, worker, position), so a
restart is reproducible for the same world size and workers but is a fresh draw, not the continuation of the old
stream: samples may repeat or be missed across a restart, as with any sampling with replacement.

Workers. DataLoader workers (data.workers) split a rank's steps round-robin (worker w builds local steps w, w+W,
...); the DataLoader returns them in step order, so the batches do not depend on the number of workers.

Bad samples (corrupt JPEG, member that is not an image, missing label, truncated tar, missing member) are replaced
by another sample of the same local batch, re-augmented, so shapes stay fixed; each is counted per rank by kind in
`metrics()`, summed over the data-parallel ranks where the run logs them (`global_metrics`). A shard whose manifest
count is 0 is skipped and counted in data/empty_shards. When a rank's errors in
the current epoch exceed data.error_budget x the samples it reads per epoch, the run stops with a UserError naming
the shard and key. A missing manifest or shard fails at construction.
"""

import json
import logging
import os
import random
from bisect import bisect_right
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset

from scale.data.batch import Batch
from scale.data.loader_protocol import BatchLoader
from scale.data.photometric import Photometric, resolve
from scale.data.shards.read import read_index, read_manifest
from scale.data.spec import LoaderSpec
from scale.data.views import build_views, normalize
from scale.errors import UserError

log = logging.getLogger(__name__)

MODES = ("epochs", "resampled")


class SampleError(Exception):
    def __init__(self, kind: str, where: str):
        super().__init__(f"{kind}: {where}")
        self.kind, self.where = kind, where


# ---------------------------------------------------------------------------------------------------- the order


class EpochOrder:
    """The global sample order of one epoch: a deterministic function of (seed, epoch) and the shard counts."""

    def __init__(self, counts: list[int], seed: int, epoch: int, window: int):
        self.seed, self.epoch, self.window = seed, epoch, max(1, window)
        rng = np.random.default_rng([seed, epoch, 0])
        self.shards = [int(i) for i in rng.permutation(len(counts)) if counts[i] > 0]
        self.starts = np.cumsum([0] + [counts[i] for i in self.shards]).tolist()
        self.total = self.starts[-1]
        self._window_cache: dict = {}

    def _window_perm(self, w: int) -> np.ndarray:
        if w not in self._window_cache:
            size = min(self.window, self.total - w * self.window)
            self._window_cache = {w: np.random.default_rng([self.seed, self.epoch, 1, w]).permutation(size)}
        return self._window_cache[w]

    def __getitem__(self, position: int) -> tuple[int, int]:
        """(shard number, sample number in the shard) at this position of the epoch."""
        w, j = divmod(position, self.window)
        stream = w * self.window + int(self._window_perm(w)[j])
        k = bisect_right(self.starts, stream) - 1
        return self.shards[k], stream - self.starts[k]


def repeated_slot(position: int, repeats: int, global_batch: int) -> int:
    """The index, in the epoch's repeated list, that `position` reads under repeated augmentation.

    DeiT's RASampler (samplers.py) repeats each index of the epoch's permutation `repeats` times, [a, a, a, b, b, b,
    ...], and rank r of W reads entries r, r + W, r + 2W, ...: global step s holds entries [s*G, (s+1)*G), and the
    copies of one image go to different ranks. The same entries make scale's global step s; within it they are laid
    out by their index mod `repeats` first (entries with residue 0, then 1, ...), so that the copies of an image sit
    about G / repeats apart and scale's contiguous rank slices put them on different ranks whenever a rank's slice
    is at most G / repeats. The layout depends on G only, not on the world size: resumes stay exact for any."""
    step, slot = divmod(position, global_batch)
    first = step * global_batch
    for residue in range(repeats):
        offset = (residue - first) % repeats  # the batch's first entry with this residue
        count = max(0, -(-(global_batch - offset) // repeats))
        if slot < count:
            return first + offset + slot * repeats
        slot -= count
    raise AssertionError("unreachable: the residue classes cover the batch")


class RepeatedOrder:
    """The epoch order under repeated augmentation (data.repeated_aug = k > 1): position p reads the sample at
    position repeated_slot(p) // k of the plain order, so each image of its head appears k times, each copy with
    its own augmentation (drawn from its own position)."""

    def __init__(self, order: EpochOrder, repeats: int, global_batch: int):
        self.order, self.repeats, self.global_batch = order, repeats, global_batch

    def __getitem__(self, position: int) -> tuple[int, int]:
        return self.order[repeated_slot(position, self.repeats, self.global_batch) // self.repeats]


def epoch_order(counts: list[int], seed: int, epoch: int, window: int, repeats: int, global_batch: int):
    """The order of one epoch: EpochOrder, repeated when repeats > 1."""
    order = EpochOrder(counts, seed, epoch, window)
    return order if repeats == 1 else RepeatedOrder(order, repeats, global_batch)


# ---------------------------------------------------------------------------------------------------- reading samples


class ShardReader:
    """Reads samples by (shard, index) through the member index; keeps one file open per shard it touched."""

    def __init__(self, shard_dir: Path, manifest: dict):
        self.dir, self.manifest = shard_dir, manifest
        self.label_kind = manifest["label_kind"]
        self.num_classes = len(manifest["classes"])
        self._index: dict = {}
        self._files: dict = {}

    def members(self, shard: int):
        if shard not in self._index:
            try:
                self._index[shard] = read_index(self.dir, self.manifest["shards"][shard])
            except UserError as err:  # a corrupt .idx: its samples count as bad ones, the message names it
                self._index[shard] = ([], str(err))
        return self._index[shard]

    def where(self, shard: int, key: str) -> str:
        return f"{self.dir / self.manifest['shards'][shard]['name']} key {key}"

    def read(self, shard: int, i: int) -> tuple[str, bytes, object]:
        name = self.manifest["shards"][shard]["name"]
        members, error = self.members(shard)
        if i >= len(members):
            raise SampleError("truncated", f"{self.dir / name} sample #{i} ({error or 'not in the tar'})")
        key, exts = members[i]
        where = self.where(shard, key)
        if "jpg" not in exts:
            raise SampleError("not_image", f"{where} (no .jpg member)")
        jpg = self._bytes(shard, exts["jpg"], where)
        label = self._label(shard, exts, where)
        return key, jpg, label

    def _bytes(self, shard: int, span, where: str) -> bytes:
        if shard not in self._files:
            try:
                self._files[shard] = open(self.dir / self.manifest["shards"][shard]["name"], "rb")
            except OSError as err:  # deleted or unreadable during the run: its samples count as bad ones
                raise SampleError("missing", f"{where} (shard unreadable: {err.strerror})") from None
        f = self._files[shard]
        f.seek(span[0])
        data = f.read(span[1])
        if len(data) != span[1]:
            raise SampleError("truncated", f"{where} (member cut short)")
        return data

    def _label(self, shard: int, exts: dict, where: str):
        if self.label_kind == "none":
            return -1
        ext = "cls" if self.label_kind == "single" else "labels"
        if ext not in exts:
            raise SampleError("missing_label", f"{where} (no .{ext} member)")
        text = self._bytes(shard, exts[ext], where)
        return parse_label(text, self.label_kind, where, self.num_classes)


def parse_label(text: bytes, label_kind: str, where: str, num_classes: int):
    """A sample's label (`single`: a class index; `multi`: a list of them), each one of the manifest's
    `num_classes` (none listed: not checked): an index outside them would fail the class head's loss or the online
    probe far from its sample, so it is a bad sample named here."""
    try:
        label = int(text) if label_kind == "single" else [int(x) for x in json.loads(text)]
    except (ValueError, TypeError):  # not a number, or a JSON value that is not a list of them
        raise SampleError("missing_label", f"{where} (label not readable: {text[:40]!r})") from None
    wrong = [x for x in ([label] if label_kind == "single" else label) if num_classes and not 0 <= x < num_classes]
    if wrong:
        raise SampleError("bad_label", f"{where} (class {wrong[0]}: the manifest lists {num_classes} classes)")
    return label


def make_views(views, data: bytes, rng: random.Random, where: str):
    try:
        return views(data, rng)
    except Exception as err:  # PIL raises many types for bad bytes
        raise SampleError("decode", f"{where} ({type(err).__name__}: {err})") from None


def labels_tensor(labels: list, label_kind: str, num_classes: int) -> torch.Tensor:
    if label_kind != "multi":
        return torch.tensor(labels, dtype=torch.int64)
    out = torch.zeros(len(labels), num_classes)
    for row, classes in enumerate(labels):
        out[row, classes] = 1.0
    return out


def collate(samples: list, views, mean, std, label_kind: str, num_classes: int) -> Batch:
    """samples: [(key, groups, label)] -> Batch with view-major groups; photometric_on=device: uint8 crops and their
    parameter rows, which Batch.to applies on the device."""
    deferred = getattr(views, "photometric_on", "cpu") == "device"
    crops, params = [], []
    for g, n_views in enumerate(views.views_per_group):
        views_g = [s[1][g][v] for v in range(n_views) for s in samples]
        if deferred:
            # the crops are HWC arrays seen as CHW: stacked in HWC (one copy each), shipped channels-last
            crops.append(torch.stack([crop.permute(1, 2, 0) for crop, _ in views_g]).permute(0, 3, 1, 2))
            params.append([row for _, row in views_g])
        else:
            stacked = torch.stack(views_g)
            crops.append(stacked if getattr(views, "normalized", False) else normalize(stacked, mean, std))
    return Batch(
        crops,
        list(views.views_per_group),
        labels_tensor([s[2] for s in samples], label_kind, num_classes),
        [s[0] for s in samples],
        Photometric.of(params, mean, std, views.blur_taps) if deferred else None,
    )


# ---------------------------------------------------------------------------------------------------- datasets


class _EpochSteps(IterableDataset):
    """Local steps [start, stop) of one epoch of one rank; worker w of W builds steps start+w, start+w+W, ..."""

    def __init__(self, loader: "Loader", epoch: int, start: int, stop: int):
        self.loader, self.epoch, self.start, self.stop = loader, epoch, start, stop

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        ld = self.loader
        order = epoch_order(ld.counts, ld.seed, self.epoch, ld.cfg.shuffle_buffer, ld.repeats, ld.global_batch)
        reader = ShardReader(ld.dir, ld.manifest)
        for step in range(self.start + wid, self.stop, nw):
            base = step * ld.global_batch + ld.rank * ld.local_batch
            yield self._batch(order, reader, range(base, base + ld.local_batch))

    def _batch(self, order: EpochOrder, reader: ShardReader, positions) -> tuple:
        ld = self.loader
        samples, errors, failed = [], [], []
        for pos in positions:
            rng = random.Random(f"{ld.seed}/{self.epoch}/{pos}")
            try:
                shard, index = order[pos]
                key, data, label = reader.read(shard, index)
                samples.append((key, make_views(ld.views, data, rng, reader.where(shard, key)), label, data))
            except SampleError as err:
                errors.append((err.kind, err.where))
                failed.append(rng)
        if failed and not samples:
            raise UserError(f"every sample of a batch is bad, e.g. {errors[0][1]}")
        for n, rng in enumerate(failed):  # keep shapes fixed: re-augment good samples of this batch
            key, _, label, data = samples[n % len(samples)]
            samples.append((key, ld.views(data, rng), label, data))
        return collate(
            samples, ld.views, ld.views_cfg.mean, ld.views_cfg.std, reader.label_kind, reader.num_classes
        ), errors


class _Resampled(IterableDataset):
    """An infinite webdataset stream for one rank: local steps [start, stop), split round-robin over workers."""

    def __init__(self, loader: "Loader", start: int, stop: int):
        self.loader, self.start, self.stop = loader, start, stop

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        ld = self.loader
        seed = hash_seed(ld.seed, ld.rank, wid, nw, self.start)
        urls = [str(ld.dir / s["name"]) for s in ld.manifest["shards"] if s["count"] > 0]
        errors: list = []

        def handler(exn) -> bool:
            errors.append(("truncated", f"{exn}"))
            return True

        reader = ShardReader(ld.dir, ld.manifest)
        pipeline = wds.DataPipeline(
            wds.ResampledShards(urls, seed=seed, deterministic=True),
            wds.tarfile_to_samples(handler=handler),
            wds.shuffle(ld.cfg.shuffle_buffer, rng=random.Random(seed)),
        )
        rng = random.Random(seed)
        stream = iter(pipeline)
        for _ in range(self.start + wid, self.stop, nw):
            samples = []
            while len(samples) < ld.local_batch:
                sample = next(stream)
                where = f"{sample.get('__url__', '?')} key {sample.get('__key__', '?')}"
                try:
                    if "jpg" not in sample:
                        raise SampleError("not_image", f"{where} (no .jpg member)")
                    label = (
                        -1
                        if reader.label_kind == "none"
                        else _stream_label(sample, reader.label_kind, where, reader.num_classes)
                    )
                    samples.append((sample["__key__"], make_views(ld.views, sample["jpg"], rng, where), label))
                except SampleError as err:
                    errors.append((err.kind, err.where))
            yield (
                collate(samples, ld.views, ld.views_cfg.mean, ld.views_cfg.std, reader.label_kind, reader.num_classes),
                list(errors),
            )
            errors.clear()


def _stream_label(sample: dict, label_kind: str, where: str, num_classes: int):
    ext = "cls" if label_kind == "single" else "labels"
    if ext not in sample:
        raise SampleError("missing_label", f"{where} (no .{ext} member)")
    return parse_label(sample[ext], label_kind, where, num_classes)


def hash_seed(*parts) -> int:
    return random.Random("/".join(str(p) for p in parts)).getrandbits(63)


# ---------------------------------------------------------------------------------------------------- the loader


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity: a Slurm allocation or taskset), as torch's DataLoader
    counts them when it checks the worker count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS)
        return os.cpu_count() or 1


_said_workers: set = set()


def worker_count(wanted: int, what: str) -> int:
    """data.workers capped by the CPUs available to this rank. More workers than CPUs only time-slice them, and
    torch warns ("This DataLoader will create N worker processes ... suggested max ...") on every iterator, i.e.
    every epoch of every rank; the cap is logged once per process instead. The batches do not depend on the number
    of workers (see Workers above)."""
    cpus = available_cpus()
    if wanted <= cpus:
        return wanted
    if (wanted, cpus) not in _said_workers:
        _said_workers.add((wanted, cpus))
        log.info("data.workers=%d but %d CPU(s) available to this process (%s): using %d", wanted, cpus, what, cpus)
    return cpus


class Loader(BatchLoader):
    reads_ahead = False  # scale.data.prefetch copies its batches to a GPU ahead of the step

    def __init__(self, spec: LoaderSpec):
        """spec.pin_memory: batches for a CUDA device, in page-locked memory (asynchronous copies,
        scale.data.prefetch); data.views.photometric_on=auto then puts the photometric ops on that device."""
        self.cfg, self.views_cfg, self.dir = spec.data, spec.views, spec.shard_dir
        self.manifest = read_manifest(self.dir)
        self.counts = [int(s["count"]) for s in self.manifest["shards"]]
        self.num_samples = sum(self.counts)
        self.samples_per_epoch = spec.samples_per_epoch or self.num_samples
        if self.cfg.mode == "epochs" and self.samples_per_epoch > self.num_samples:
            raise UserError(
                f"samples_per_epoch={self.samples_per_epoch} exceeds the {self.num_samples} samples of "
                f"{self.dir} (mode epochs visits each sample at most once per epoch)"
            )
        self.global_batch, self.rank, self.world_size, self.seed = (
            spec.global_batch,
            spec.rank,
            spec.world_size,
            spec.seed,
        )
        self.local_batch, self.pin_memory = spec.local_batch, spec.pin_memory
        self.steps_per_epoch = self.samples_per_epoch // self.global_batch
        if self.steps_per_epoch == 0:
            raise UserError(
                f"{self.dir}: {self.samples_per_epoch} samples per epoch is less than one global batch "
                f"({self.global_batch})"
            )
        self.views = build_views(self.views_cfg, resolve(self.views_cfg.photometric_on, cuda=self.pin_memory))
        self.position = 0
        self.errors: Counter = Counter()
        self.epoch_errors = 0
        self.samples_seen = 0
        self.empty_shards = sum(1 for c in self.counts if c == 0)
        self.workers = worker_count(int(self.cfg.workers), f"{spec.split} loader, rank {self.rank}")
        # repeated augmentation is a training sampler (DeiT main.py: RASampler for the training set only)
        self.repeats = int(self.cfg.repeated_aug) if spec.split == "train" else 1
        if self.repeats > 1 and self.cfg.mode != "epochs":
            raise UserError(
                f"data.repeated_aug={self.repeats} needs data.mode=epochs (it repeats samples of the epoch order)"
            )

    @property
    def epoch(self) -> int:
        return self.position // (self.steps_per_epoch * self.global_batch)

    @property
    def step_in_epoch(self) -> int:
        return self.position % (self.steps_per_epoch * self.global_batch) // self.global_batch

    def __len__(self) -> int:
        return self.steps_per_epoch

    def __iter__(self):
        epoch, start = self.epoch, self.step_in_epoch
        if self.cfg.mode == "epochs":
            dataset = _EpochSteps(self, epoch, start, self.steps_per_epoch)
        else:
            dataset = _Resampled(
                self,
                self.position // self.global_batch,
                self.position // self.global_batch + self.steps_per_epoch - start,
            )
        workers = self.workers
        # an own generator: creating the iterator must not draw from the global torch RNG, or a resumed run
        # (which creates it at another step) would see different dropout / drop-path masks
        generator = torch.Generator().manual_seed(hash_seed(self.seed, epoch, self.rank) % 2**63)
        loader = DataLoader(
            dataset,
            batch_size=None,
            num_workers=workers,
            persistent_workers=False,
            prefetch_factor=2 if workers else None,
            generator=generator,
            pin_memory=self.pin_memory,
        )
        if start == 0:
            self.epoch_errors = 0
        for batch, errors in loader:
            self._count(errors)
            self.position += self.global_batch
            self.samples_seen += self.local_batch
            yield batch

    def _count(self, errors: list) -> None:
        for kind, _where in errors:
            self.errors[kind] += 1
        self.epoch_errors += len(errors)
        allowed = self.cfg.error_budget * self.steps_per_epoch * self.local_batch
        if errors and self.epoch_errors > allowed:
            kind, where = errors[-1]
            raise UserError(
                f"too many bad samples on rank {self.rank}: {self.epoch_errors} this epoch, budget "
                f"{self.cfg.error_budget:g} x {self.steps_per_epoch * self.local_batch} samples; "
                f"last: {kind} in {where}"
            )

    def metrics(self) -> dict:
        out = {
            "data/errors": sum(self.errors.values()),
            "data/empty_shards": self.empty_shards,
            "data/samples": self.samples_seen,
        }
        out.update({f"data/errors_{kind}": n for kind, n in sorted(self.errors.items())})
        return out

    def counters(self) -> dict:
        """This rank's data counters (metrics and error budget); the checkpointer keeps them per rank, so that a
        resumed run continues them instead of starting at 0."""
        return {"samples": self.samples_seen, "epoch_errors": self.epoch_errors, "errors": dict(self.errors)}

    def load_counters(self, state: dict) -> None:
        """Counters from `counters()`; a missing key (a checkpoint written before they were saved) means 0."""
        self.samples_seen = int(state.get("samples", 0))
        self.epoch_errors = int(state.get("epoch_errors", 0))
        self.errors = Counter({str(kind): int(n) for kind, n in state.get("errors", {}).items()})

    def state_dict(self) -> dict:
        return {
            "position": self.position,
            "mode": self.cfg.mode,
            "seed": self.seed,
            "global_batch": self.global_batch,
            "samples_per_epoch": self.samples_per_epoch,
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("global_batch", self.global_batch) != self.global_batch:
            raise UserError(
                f"loader state was saved with global_batch {state['global_batch']}, this run uses "
                f"{self.global_batch}: the sample position would not be exact"
            )
        self.position = int(state["position"])


# the same on every rank (every rank reads the whole manifest), not summed
SHARED_METRICS = ("data/empty_shards",)


def global_metrics(metrics: dict, group) -> dict:
    """A loader's `metrics()` (this rank's samples and bad samples by kind) summed over the data-parallel `group`,
    so that metrics.jsonl says what the whole run read: rank 0's own figures were a fraction of it, which changed
    with the world size. A collective of `group` (a small object gather: call it on log steps only)."""
    if group is None or dist.get_world_size(group) == 1:
        return metrics
    gathered: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, metrics, group=group)
    keys = sorted({key for rank in gathered for key in rank})
    return {
        key: metrics.get(key, 0) if key in SHARED_METRICS else sum(rank.get(key, 0) for rank in gathered)
        for key in keys
    }
