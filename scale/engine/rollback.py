"""Undo a checkpoint load that failed half-way: DCP and DeepSpeed load into the live tensors (a state dict's
tensors are the module's own), so a load that fails after some of them were read would leave the model part old,
part new. A copy of every tensor it may write is taken first (on the CPU) and written back when the load fails.
In engine/ because both the checkpointer (DCP) and the DeepSpeed engine (its own load) use it."""

import torch
from torch.distributed.tensor import DTensor


def _tensors(state) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state.to_local() if isinstance(state, DTensor) else state]
    if isinstance(state, dict):
        return [t for value in state.values() for t in _tensors(value)]
    if isinstance(state, (list, tuple)):
        return [t for value in state for t in _tensors(value)]
    return []


def snapshot(state) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(live tensor, CPU copy) of every tensor in a nested state dict (this rank's shard of a DTensor)."""
    return [(t, t.detach().to("cpu", copy=True)) for t in _tensors(state)]


@torch.no_grad()
def restore(saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for live, copy in saved:
        live.copy_(copy)
