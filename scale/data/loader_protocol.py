"""What the training loop, the checkpointer and the logs ask of a loader, declared once: the shard loader
(scale/data/loader.py), the DALI loader (scale/data/dali/loader.py), the random batches of `--synthetic-data`
(scale/data/synthetic.py) and the GPU prefetcher that wraps any of them (scale/data/prefetch.py) each subclass
`BatchLoader`, and tests/data/test_loader_protocol.py checks that every one defines each member with these
signatures."""

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from scale.data.batch import Batch


@runtime_checkable
class BatchLoader(Protocol):
    steps_per_epoch: int  # optimizer steps in one epoch: the schedules and the epoch count read it

    def __len__(self) -> int:
        """Steps per epoch (`steps_per_epoch`)."""
        ...

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch, one batch of this rank per step (all of it after an epoch ends)."""
        ...

    def metrics(self) -> dict:
        """This rank's data metrics for metrics.jsonl ('data/...' keys; {} when there are none)."""
        ...

    def state_dict(self) -> dict:
        """The position in the data, the same on every rank: the run checkpoint keeps one copy."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict()`: the next batch is the one an uninterrupted run would read next."""
        ...

    def counters(self) -> dict:
        """This rank's own counters (samples read, bad samples): the checkpointer keeps them per rank."""
        ...

    def load_counters(self, state: dict) -> None:
        """Continue this rank's counters from a `counters()`."""
        ...
