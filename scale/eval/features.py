"""Frozen features: extraction on every rank, gathering to every rank, save and reload.

Each rank runs the backbone on its share of the data; the rows of all ranks are then gathered (padded all_gather,
so ranks may hold different counts), de-duplicated by sample key and sorted by key, so the result does not depend
on the world size or on how the loader split or padded the data.
"""

import inspect
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from scale.checkpoint.safe_load import why_not_loaded
from scale.data.batch import Batch
from scale.errors import UserError
from scale.nofollow import replacing
from scale.watch.weighted_knn import gather_rows

FORMAT = "scale-features-1"
FeatureFn = Callable[[nn.Module, torch.Tensor], torch.Tensor]


def pooled(backbone: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The k-NN feature: ViT class token after the final norm, Swin average-pooled last stage."""
    return backbone(images)["pooled"]


def last_blocks(n: int, avgpool: bool = False) -> FeatureFn:
    """The linear-probe feature: concatenated pooled outputs of the last n blocks (ViT: normed class tokens; Swin:
    average-pooled blocks), with `avgpool` also the mean of the last block's patch tokens (DINO, ViT-B)."""

    def feature(backbone: nn.Module, images: torch.Tensor) -> torch.Tensor:
        if not avgpool:
            return torch.cat(backbone.forward_last_blocks(images, n), dim=-1)
        if "avgpool" not in inspect.signature(backbone.forward_last_blocks).parameters:
            raise UserError(
                f"eval.linear_avgpool: {type(backbone).__name__} has no class token to add pooled "
                f"patch tokens to (it is ViT-only); set it to false"
            )
        return torch.cat(backbone.forward_last_blocks(images, n, avgpool=True), dim=-1)

    return feature


def world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Features:
    """Rows of features with their labels and sample keys (sorted by key after a gather)."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, keys: list[str]):
        if not (features.shape[0] == labels.shape[0] == len(keys)):
            raise ValueError(f"{features.shape[0]} features, {labels.shape[0]} labels, {len(keys)} keys")
        self.features, self.labels, self.keys = features, labels, keys

    def __len__(self) -> int:
        return len(self.keys)

    def subset(self, rows: torch.Tensor) -> "Features":
        rows_list = rows.tolist()
        return Features(self.features[rows], self.labels[rows], [self.keys[i] for i in rows_list])

    def state(self) -> dict:
        return {"features": self.features, "labels": self.labels, "keys": self.keys}


@torch.no_grad()
def extract(backbone: nn.Module, batches: Iterable[Batch], feature_fn: FeatureFn, device: torch.device) -> Features:
    """This rank's features (on the CPU) of every batch: one eval view per image (crops[0])."""
    backbone.eval()
    feats, labels, keys = [], [], []
    for batch in batches:
        if batch.views_per_group[0] != 1:
            raise UserError(
                f"feature extraction expects one view per image (data.views.kind=eval), got "
                f"{batch.views_per_group[0]} views"
            )
        images = batch.crops[0].to(device, non_blocking=True)
        feats.append(feature_fn(backbone, images).float().cpu())
        labels.append(batch.labels.cpu())
        # without keys, rows cannot be de-duplicated; a rank prefix at least keeps them apart
        keys += list(batch.keys) or [f"r{world()[0]}-{len(keys) + i:09d}" for i in range(images.shape[0])]
    if not feats:
        return Features(torch.zeros(0, 0), torch.zeros(0, dtype=torch.long), [])
    return Features(torch.cat(feats), torch.cat(labels), keys)


def gather(local: Features, device: torch.device) -> Features:
    """All ranks' features on every rank (CPU), de-duplicated by key and sorted by key."""
    _, size = world()
    if size > 1:
        keys = [None] * size
        dist.all_gather_object(keys, local.keys)
        dim = torch.tensor([local.features.shape[1] if len(local) else 0], device=device)
        dist.all_reduce(dim, op=dist.ReduceOp.MAX)  # a rank without data does not know the feature size
        feats = local.features if len(local) else torch.zeros(0, int(dim.item()))
        feats = gather_rows(feats.to(device)).cpu()
        labels = gather_rows(local.labels.to(device)).cpu()
        local = Features(feats, labels, [k for part in keys for k in part])
    first: dict[str, int] = {}
    for row, key in enumerate(local.keys):
        first.setdefault(key, row)  # padding of the last batch repeats samples
    order = sorted(first)
    return local.subset(torch.tensor([first[k] for k in order], dtype=torch.long))


def save(path: str | Path, splits: dict[str, Features], meta: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path, binary=True) as out:
        torch.save({"format": FORMAT, "meta": meta, "splits": {n: f.state() for n, f in splits.items()}}, out)


def load(path: str | Path) -> tuple[dict[str, Features], dict]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"features file not found: {path}")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle/zip errors come in many types
        raise UserError(why_not_loaded(path, err, "not a features file written by `scale eval`")) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"{path}: not a features file written by `scale eval` (format {FORMAT})")
    return {n: Features(s["features"], s["labels"], list(s["keys"])) for n, s in data["splits"].items()}, data["meta"]
