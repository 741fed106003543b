"""A profiler trace's device time, measured as the union of the kernels' intervals (issue 44: summing
`self_device_time_total` over `key_averages()` counts a kernel on its own row and on the CPU op that launched it),
the idle gaps between kernels, and the kernels with the most device time. Reads torch.profiler's chrome trace
(`prof.export_chrome_trace`): complete events ("ph": "X") of category "kernel" (plus "gpu_memcpy"/"gpu_memset",
which keep the device busy too), timestamps and durations in microseconds."""

import json
from pathlib import Path

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
TOP = 10
GAP_US = 20.0  # idle gaps shorter than this are launch latency, not counted among the largest gaps


def device_events(trace: dict) -> list[dict]:
    return [
        e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat", "").lower() in DEVICE_CATEGORIES
    ]


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merged, sorted, non-overlapping intervals (kernels of several streams overlap)."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def summarise(trace: dict, window_us: float | None = None, steps: int = 1) -> dict:
    """Device busy as a fraction of the window (the wall time of the profiled steps; default: first kernel start to
    last kernel end), the idle gaps, and the top kernels by summed duration."""
    events = device_events(trace)
    if not events:
        return {"kernels": 0}
    spans = union([(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events])
    busy = sum(b - a for a, b in spans)
    window = window_us or (spans[-1][1] - spans[0][0])
    gaps = sorted((b[0] - a[1] for a, b in zip(spans, spans[1:])), reverse=True)
    by_name: dict[str, list[float]] = {}
    for e in events:
        entry = by_name.setdefault(e.get("name", "?"), [0.0, 0])
        entry[0] += float(e.get("dur", 0))
        entry[1] += 1
    top = sorted(by_name.items(), key=lambda item: -item[1][0])[:TOP]
    return {
        "kernels": len(events),
        "kernels_per_step": round(len(events) / steps, 1),
        "busy_us": round(busy, 1),
        "window_us": round(window, 1),
        "device_busy": round(busy / window, 4) if window else None,
        "idle_us": round(window - busy, 1),
        "gaps_over_20us": sum(1 for g in gaps if g >= GAP_US),
        "idle_in_gaps_over_20us": round(sum(g for g in gaps if g >= GAP_US), 1),
        "largest_gaps_us": [round(g, 1) for g in gaps[:5]],
        "top_kernels": [
            {"name": name[:120], "us": round(us, 1), "share": round(us / busy, 4), "calls": calls}
            for name, (us, calls) in top
        ],
    }


def read(path: Path) -> dict:
    return json.loads(Path(path).read_text())
