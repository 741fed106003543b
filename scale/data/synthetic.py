"""Random batches in a recipe's batch layout, for benchmarking without shards (`--synthetic-data`)."""

import torch

from scale.data.batch import Batch
from scale.data.loader_protocol import BatchLoader
from scale.data.views import CropViews
from scale.errors import UserError

IMAGENET_TRAIN = 1281167  # samples per epoch when the recipe does not say (schedules, time per epoch)


def crop_layout(views) -> list[tuple[int, int]]:
    """(views, px) per resolution group, as the recipe's view maker produces them."""
    if views.kind in ("multicrop", "two_view"):
        return [(len(group), group[0].size) for group in CropViews(views).groups]
    if views.kind == "supervised":
        return [(1, views.global_size)]
    if views.kind == "eval":
        return [(1, views.eval_crop)]
    raise UserError(f"data.views.kind '{views.kind}' has no batch layout")


def random_batch(cfg, images: int, generator: torch.Generator | None = None) -> Batch:
    """`images` images of the recipe's layout: normalised-like crops N(0, 1) and labels of its classes."""
    layout = crop_layout(cfg.data.views)
    crops = [torch.randn(n * images, 3, px, px, generator=generator) for n, px in layout]
    labels = torch.randint(0, cfg.data.num_classes, (images,), generator=generator)
    return Batch(crops, [n for n, _ in layout], labels, [f"synthetic-{i}" for i in range(images)])


class SyntheticLoader(BatchLoader):
    """A loader (scale/data/loader_protocol.py) yielding one fixed random batch per step. With a `device` the batch
    is made once and kept there (`on_device`): a step then copies nothing, where a host batch would be a pageable
    fp32 copy per step, which no real loader makes (they pin uint8 crops); the step skips its host check too (the
    batch is valid by construction)."""

    def __init__(self, cfg, rank: int, world_size: int, device: torch.device | None = None):
        if cfg.train.global_batch % world_size:
            raise UserError(f"train.global_batch {cfg.train.global_batch} is not divisible by {world_size} ranks")
        generator = torch.Generator().manual_seed(cfg.train.seed + rank)
        self.batch = random_batch(cfg, cfg.train.global_batch // world_size, generator)
        self.on_device = device is not None
        if device is not None:
            self.batch = self.batch.to(device)
        samples = cfg.train.samples_per_epoch or IMAGENET_TRAIN
        self.steps_per_epoch = max(1, samples // cfg.train.global_batch)

    def __len__(self) -> int:
        return self.steps_per_epoch

    def __iter__(self):
        for _ in range(self.steps_per_epoch):
            yield self.batch

    def metrics(self) -> dict:
        return {}

    # what the checkpointer reads and restores (`scale train --synthetic-data` checkpoints and resumes like a run)
    def state_dict(self) -> dict:
        return {"position": None, "synthetic": True}

    def load_state_dict(self, state: dict) -> None:
        pass

    def counters(self) -> dict:
        return {}

    def load_counters(self, state: dict) -> None:
        pass
