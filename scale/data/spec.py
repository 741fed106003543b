"""LoaderSpec: what a loader is asked for, built once by the caller and handed unchanged to
`scale.data.factory.build_loader`, and from it to Loader (scale/data/loader.py) or DaliLoader (scale/data/dali/)."""

from dataclasses import dataclass
from pathlib import Path

from scale.errors import UserError

SPLITS = ("train", "val")


@dataclass(frozen=True)
class LoaderSpec:
    data: object  # the recipe's data section: data.train / data.val, mode, backend, workers, error_budget, ...
    split: str  # which shard directory to read: data.train or data.val
    global_batch: int  # samples per step over all data-parallel ranks
    rank: int  # this rank among the data-parallel ranks
    world_size: int  # the number of data-parallel ranks
    seed: int
    samples_per_epoch: int | None = None  # None: every sample of the shards
    views: object = None  # the views section; None: data.views
    pin_memory: bool = False  # batches for a CUDA device, in page-locked memory (asynchronous copies)

    def __post_init__(self):
        if self.split not in SPLITS:
            raise UserError(f"split must be train or val, got '{self.split}'")
        if self.global_batch <= 0 or self.global_batch % self.world_size:
            raise UserError(
                f"train.global_batch={self.global_batch} must be a positive multiple of the world size "
                f"{self.world_size}"
            )
        if self.views is None:
            object.__setattr__(self, "views", self.data.views)  # frozen: resolved here, once

    @property
    def shard_dir(self) -> Path:
        return Path(self.data.train if self.split == "train" else self.data.val)

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.world_size
