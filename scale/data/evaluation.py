"""Exact evaluation passes over a shard directory: every sample exactly once, split over ranks without padding.

The training loader drops the tail of an epoch that does not fill a global batch and keeps every rank at the same
step count; an evaluation must see every sample, and needs no per-batch collective, so rank r simply reads samples
r, r + W, r + 2W, ... of the directory in its stored order. Samples are read through the shard member index with
the training loader's reader, views and normalisation; a bad sample fails the evaluation, naming it.
"""

import copy
import random
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, Dataset

from scale.data.batch import Batch
from scale.data.loader import SampleError, ShardReader, labels_tensor, make_views, worker_count
from scale.data.shards.read import read_manifest
from scale.data.views import build_views, normalize
from scale.errors import UserError


def eval_views_cfg(views_cfg, kind: str = "eval"):
    """A copy of the recipe's views section with another kind (eval: resize + center crop)."""
    cfg = copy.deepcopy(views_cfg)
    if OmegaConf.is_config(cfg):
        OmegaConf.set_readonly(cfg, False)
    cfg.kind = kind
    return cfg


class ShardSamples(Dataset):
    """Sample i of a shard directory (in stored order), with the views of `views_cfg` (one view per image)."""

    def __init__(self, shard_dir, views_cfg, seed: int = 0):
        self.dir = Path(shard_dir)
        self.manifest = read_manifest(self.dir)
        counts = [int(s["count"]) for s in self.manifest["shards"]]
        self.locations = [(shard, i) for shard, count in enumerate(counts) for i in range(count)]
        self.views = build_views(views_cfg)
        if self.views.views_per_group != [1]:
            raise UserError(
                f"evaluation needs one view per image, data.views.kind={views_cfg.kind} makes "
                f"{self.views.views_per_group}"
            )
        self.views_cfg, self.seed = views_cfg, seed
        self.label_kind = self.manifest["label_kind"]
        self.num_classes = len(self.manifest["classes"])
        self._reader = None

    def __len__(self) -> int:
        return len(self.locations)

    def __getitem__(self, index: int):
        if self._reader is None:  # opened lazily: one set of file handles per worker
            self._reader = ShardReader(self.dir, self.manifest)
        try:
            key, data, label = self._reader.read(*self.locations[index])
            crop = make_views(self.views, data, random.Random(f"{self.seed}/{index}"), f"{self.dir} key {key}")
        except SampleError as err:
            raise UserError(f"evaluation cannot skip samples: {err}") from None
        return key, crop[0][0], label

    def collate(self, samples: list) -> Batch:
        crops = torch.stack([s[1] for s in samples])
        if not getattr(self.views, "normalized", False):
            crops = normalize(crops, self.views_cfg.mean, self.views_cfg.std)
        return Batch(
            [crops],
            [1],
            labels_tensor([s[2] for s in samples], self.label_kind, self.num_classes),
            [s[0] for s in samples],
        )


def eval_batches(
    shard_dir, views_cfg, batch_size: int, rank: int = 0, world_size: int = 1, workers: int = 0, seed: int = 0
) -> DataLoader:
    """This rank's share of every sample of shard_dir, in batches of at most batch_size (one view per image)."""
    dataset = ShardSamples(shard_dir, views_cfg, seed)
    return _batches(dataset, range(rank, len(dataset), world_size), batch_size, workers)


def lockstep_batches(
    shard_dir, views_cfg, batch_size: int, rank: int = 0, world_size: int = 1, workers: int = 0, seed: int = 0
) -> tuple[DataLoader, int]:
    """`eval_batches` with the same number of batches on every rank, for a model sharded over the ranks (FSDP2 or
    ZeRO-3 gather parameters in every forward, on all ranks together): a share one sample short of the others is
    padded with a repeat of sample 0. Returns the loader and how many of its leading samples are this rank's own."""
    dataset = ShardSamples(shard_dir, views_cfg, seed)
    if len(dataset) == 0:
        raise UserError(f"{shard_dir}: no samples to evaluate")
    mine = list(range(rank, len(dataset), world_size))
    own = len(mine)
    mine += [0] * (-(-len(dataset) // world_size) - own)
    return _batches(dataset, mine, batch_size, workers), own


def _batches(dataset: ShardSamples, indices, batch_size: int, workers: int) -> DataLoader:
    return DataLoader(
        torch.utils.data.Subset(dataset, indices),
        batch_size=batch_size,
        shuffle=False,
        num_workers=worker_count(workers, "evaluation loader"),  # at most the CPUs this rank may use
        collate_fn=dataset.collate,
        persistent_workers=False,
    )


def dataset_info(shard_dir) -> dict:
    """Label kind, class names and sample count of a shard directory."""
    manifest = read_manifest(shard_dir)
    return {
        "label_kind": manifest["label_kind"],
        "classes": list(manifest["classes"]),
        "num_samples": sum(int(s["count"]) for s in manifest["shards"]),
    }
