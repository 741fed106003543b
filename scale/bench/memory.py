"""Peak memory and time in collectives of one step (the "window"), on GPU and on CPU.

- CUDA: `torch.cuda.max_memory_allocated` since the window opened (the caching allocator's own count of tensor
  bytes); collectives = the NCCL kernels of a profiler trace of the window. Where the step replays CUDA graphs
  (engine.compile_mode=reduce-overhead), their tensors live in private pools reserved when the graphs were recorded,
  which a replay does not count as allocated (DINO ViT-S/16 at 64 images: "1.53 GiB" on an H200, where eager
  allocates 9.37): the peak is then the memory reserved, pools included (an upper bound: it holds the caching
  allocator's free blocks too).
- CPU has no allocator statistics, so the torch profiler records every allocation and free of the CPU allocator
  (`profile_memory`), from before the model is built: the running sum of those events is the number of tensor
  bytes alive (parameters, gradients, optimizer state, activations, buffers of the collectives), and its maximum
  inside the window is the peak, as CUDA's max_allocated would be. The profiler sees only the allocations and frees
  of the threads it runs on: a tensor freed on a collective backend's thread (the last owner of a temporary handed
  to gloo) stays counted, so the code measured avoids such temporaries (DDP is built without its init sync).
  Collectives = the `gloo:*` events (they run on gloo's threads and include waiting for the slowest rank).
- Both: the process's peak resident set (VmHWM, reset when the window opens; CPU only, where it also counts the
  Python heap, libraries and allocator slack).
The profiler adds overhead per op, so the window's step is not one of the timed steps.
"""

import contextlib
import os
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

WINDOW = "scale.bench.window"


def union_seconds(intervals: list[tuple[int, int]]) -> float:
    """Total length of the union of [start, end) nanosecond intervals, in seconds (overlapping collectives count
    once)."""
    total, cursor = 0, None
    for start, end in sorted(intervals):
        if cursor is None or start > cursor:
            total += end - start
            cursor = end
        elif end > cursor:
            total += end - cursor
            cursor = end
    return total / 1e9


def peak_rss_bytes() -> int | None:
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


def reset_peak_rss() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # Linux: resets VmHWM to the current RSS


class MemoryTrace:
    """`with MemoryTrace(device) as trace:` build the model, warm up, then `with trace.window():` one step;
    `trace.result()` after the with-block."""

    def __init__(self, device: torch.device, cuda_graphs: bool = False):
        self.cuda = device.type == "cuda"
        self.cuda_graphs = cuda_graphs
        self.profiler = None
        self.peak = self.start = None
        self.rss = None

    def __enter__(self) -> "MemoryTrace":
        if not self.cuda:
            # kineto, started by the first profiler, reads its log level then: on a machine without a GPU a CUDA
            # build logs "ERROR: gpuGetDeviceCount failed" and its stages, noise in a CPU benchmark's output
            os.environ.setdefault("KINETO_LOG_LEVEL", "5")
            self.profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self.profiler.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.profiler is not None and not self.cuda:
            self.profiler.__exit__(*exc)

    @contextlib.contextmanager
    def window(self):
        reset_peak_rss()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
            self.profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            with self.profiler:
                yield
                torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_reserved() if self.cuda_graphs else torch.cuda.max_memory_allocated()
        else:
            with record_function(WINDOW):
                yield
        self.rss = peak_rss_bytes()

    def result(self) -> dict:
        events = list(self.profiler.profiler.kineto_results.events())
        if self.cuda:
            comm = [(e.start_ns(), e.end_ns()) for e in events if "nccl" in e.name().lower()]
            return {
                "peak_bytes": self.peak,
                "start_bytes": self.start,
                "comm_s": union_seconds(comm),
                "rss_peak_bytes": None,
            }
        window = next(e for e in events if e.name() == WINDOW)
        begin, end = window.start_ns(), window.end_ns()
        level, start, peak = 0, None, 0
        for event in sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns()):
            if event.start_ns() >= begin and start is None:
                start = peak = level
            if event.start_ns() > end:
                break
            level += event.nbytes()
            if start is not None:
                peak = max(peak, level)
        if start is None:  # nothing allocated or freed inside the window
            start = peak = level
        comm = [
            (max(e.start_ns(), begin), min(e.end_ns(), end))
            for e in events
            if e.name().startswith("gloo:") and e.end_ns() > begin and e.start_ns() < end
        ]
        return {"peak_bytes": peak, "start_bytes": start, "comm_s": union_seconds(comm), "rss_peak_bytes": self.rss}
