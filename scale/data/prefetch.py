"""Batches on the GPU before the step asks for them (data.prefetch_to_device, on by default; CUDA only).

`prefetch_to_device` returns the loader itself on a CPU (nothing to copy), when switched off, for a loader that
reads ahead by itself (DALI) or whose batches are on the device already (the bench's synthetic batch). Otherwise a
`DevicePrefetcher`, a loader itself (scale/data/loader_protocol.py), whose iteration yields each batch already on
the device while the copy of the next one, from pinned host memory (the loader's DataLoader pins on CUDA), runs on a
side stream and overlaps the step.

Position. To start the copy of batch k+1 early, the prefetcher takes it from the loader before batch k is used,
which moves the loader's position and counters one batch ahead. So while a batch is ahead it reports the loader's
state as it was before that batch was taken: `state_dict`, `counters` and `metrics` count the batches yielded, and
a checkpoint written after step k resumes at batch k+1, as without prefetch. Those few numbers are copied on the
host once per batch; nothing waits for the device. Batches are read ahead within an epoch only, as the loader
yields them (one `iter` per epoch).

Streams. The consuming stream waits for the side stream's copy before the batch is used, and every copied tensor is
recorded on the consuming stream, so that the caching allocator does not hand its memory to another tensor while
the step still reads it.
"""

from collections.abc import Callable, Iterator

import torch

from scale.data.batch import Batch
from scale.data.loader_protocol import BatchLoader

STATE_READERS = ("state_dict", "counters", "metrics")  # what the checkpointer and the logs read from a loader
# how a batch taken ahead is given back: each recorded state that the loader loads
STATE_WRITERS = {"state_dict": "load_state_dict", "counters": "load_counters"}

Copy = Callable[[Batch], Callable[[], Batch]]  # starts a batch's copy; the returned call hands it over, ready


def prefetch_to_device(loader: BatchLoader, device: torch.device, enabled: bool, check: Callable[[Batch], None]):
    """`check` runs on each batch on the host, before its copy (Method.check_batch: a check on the device would make
    the host wait)."""
    if device.type != "cuda" or not enabled or getattr(loader, "reads_ahead", False):
        return loader
    if getattr(loader, "on_device", False):  # a synthetic batch made once on the device: nothing to copy
        return loader
    return DevicePrefetcher(loader, CudaCopy(device), check)


class CudaCopy:
    """A batch's copy to the device on a side stream; the consuming (current) stream waits for it when handed over."""

    def __init__(self, device: torch.device):
        self.device, self.stream = device, torch.cuda.Stream(device)

    def __call__(self, batch: Batch) -> Callable[[], Batch]:
        with torch.cuda.stream(self.stream):
            moved = batch.to(self.device, non_blocking=True)

        def ready() -> Batch:
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_stream(self.stream)
            for tensor in (*moved.crops, moved.labels):
                tensor.record_stream(consumer)
            return moved

        return ready


class DevicePrefetcher(BatchLoader):
    """`loader` with the next batch checked (`check`) and its copy (`copy`) started before the current batch is
    yielded."""

    def __init__(self, loader: BatchLoader, copy: Copy, check: Callable[[Batch], None]):
        self.loader, self.copy, self.check = loader, copy, check
        self.steps_per_epoch = loader.steps_per_epoch
        self._consumed: dict | None = None  # the loader's state before the batch ahead was taken; None: none ahead

    def __len__(self) -> int:
        return self.steps_per_epoch

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch, as the loader yields it."""
        if self._consumed is not None:  # an earlier iteration stopped with a batch ahead: give it back
            for reader, writer in STATE_WRITERS.items():
                getattr(self.loader, writer)(self._consumed[reader])
            self._consumed = None
        batches = iter(self.loader)
        ahead = self._take(batches)
        while ahead is not None:
            consumed = self._snapshot()  # `ahead` taken: the state once it is yielded
            current, ahead = ahead, self._take(batches)
            self._consumed = consumed if ahead is not None else None
            yield current()

    def _take(self, batches: Iterator[Batch]) -> Callable[[], Batch] | None:
        batch = next(batches, None)
        if batch is None:
            return None
        self.check(batch)
        return self.copy(batch)

    def _snapshot(self) -> dict:
        return {name: getattr(self.loader, name)() for name in STATE_READERS}

    def _read(self, name: str) -> dict:
        return self._consumed[name] if self._consumed is not None else getattr(self.loader, name)()

    def state_dict(self) -> dict:
        return self._read("state_dict")

    def counters(self) -> dict:
        return self._read("counters")

    def metrics(self) -> dict:
        return self._read("metrics")

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)
        self._consumed = None

    def load_counters(self, state: dict) -> None:
        self.loader.load_counters(state)
        self._consumed = None
