"""What the loaders yield and the methods consume.

Crops are grouped by resolution, one tensor per group, so that a backbone runs once per resolution:
`crops[g]` has shape [views_per_group[g] * B, 3, H_g, W_g] and is view-major (rows v*B .. v*B+B-1 are view v of
the B images). Multi-crop: group 0 = the global views, group 1.. = the local views of each local size.

With data.views.photometric_on=device the loader's crops are uint8 and `photometric` holds their random parameters:
`to` applies them (scale/data/photometric.py) where the batch lands on the device, so every consumer of a batch on
the device sees normalised float crops.
"""

from dataclasses import dataclass, field

import torch

from scale.data.photometric import Photometric


@dataclass
class Batch:
    crops: list[torch.Tensor]
    views_per_group: list[int]
    labels: torch.Tensor  # [B] int64 class index (-1: unlabeled), or [B, C] float for multi-label
    keys: list[str] = field(default_factory=list)
    photometric: Photometric | None = None  # uint8 crops still to augment and normalise (photometric_on=device)

    @property
    def batch_size(self) -> int:
        return self.crops[0].shape[0] // self.views_per_group[0]

    def to(self, device: torch.device, non_blocking: bool = True) -> "Batch":
        crops = [c.to(device, non_blocking=non_blocking) for c in self.crops]
        if self.photometric is not None:
            crops = self.photometric.to(device, non_blocking).apply(crops)
        return Batch(
            crops,
            list(self.views_per_group),
            self.labels.to(device, non_blocking=non_blocking),
            list(self.keys),
        )

    def pin_memory(self) -> "Batch":
        """Page-locked copies (what DataLoader(pin_memory=True) calls), from which a copy to the GPU is asynchronous."""
        photometric = self.photometric.pin_memory() if self.photometric is not None else None
        crops = [c.pin_memory() for c in self.crops]
        return Batch(crops, list(self.views_per_group), self.labels.pin_memory(), list(self.keys), photometric)


def split_batch(batch: Batch, parts: int) -> list[Batch]:
    """Split along the images (not the views) into `parts` micro-batches, keeping the view-major layout."""
    if batch.photometric is not None:
        raise ValueError("a batch is split once on the device (Batch.to), after its photometric ops")
    if parts == 1:
        return [batch]
    size = batch.batch_size
    if size % parts:
        raise ValueError(f"per-rank batch {size} is not divisible by {parts} micro-batches")
    chunk = size // parts
    micro = []
    for i in range(parts):
        crops = []
        for group, views in zip(batch.crops, batch.views_per_group):
            per_view = group.view(views, size, *group.shape[1:])[:, i * chunk : (i + 1) * chunk]
            crops.append(per_view.reshape(views * chunk, *group.shape[1:]))
        micro.append(
            Batch(
                crops,
                list(batch.views_per_group),
                batch.labels[i * chunk : (i + 1) * chunk],
                batch.keys[i * chunk : (i + 1) * chunk],
            )
        )
    return micro
