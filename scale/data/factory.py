"""`build_loader`: the recipe's data.backend picks the loader (scale/data/loader.py, or scale/data/dali for the
crop views under DALI). Kept apart from both, so that neither imports the other's importer."""

from scale.data.loader import Loader

BACKENDS = ("torchvision", "dali")  # data.backend


def build_loader(
    data_cfg,
    split: str,
    global_batch: int,
    rank: int,
    world_size: int,
    seed: int,
    samples_per_epoch: int | None = None,
    views_cfg=None,
    pin_memory: bool = False,
) -> Loader:
    """A loader over data_cfg.train or data_cfg.val (scale/data/loader.py's docstring says what it guarantees);
    with data.backend=dali, the crop views (multicrop, two_view) come from scale.data.dali, the others from Loader.
    `pin_memory` (torchvision backend): batches in page-locked memory, for asynchronous copies to a GPU."""
    kind = (views_cfg if views_cfg is not None else data_cfg.views).kind
    if data_cfg.backend == "dali" and kind in ("multicrop", "two_view"):
        from scale.data.dali import build_dali_loader

        return build_dali_loader(data_cfg, split, global_batch, rank, world_size, seed, samples_per_epoch, views_cfg)
    return Loader(data_cfg, split, global_batch, rank, world_size, seed, samples_per_epoch, views_cfg, pin_memory)
