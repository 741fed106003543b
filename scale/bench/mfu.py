"""FLOPs of a training step and the device's peak FLOP/s, for MFU.

Model FLOPs of one step = 3 x the student's forward (forward + backward, the backward costing twice the forward)
+ 1 x the teacher's forward, every crop counted, from `scale.bench.trace` (FLOPs = 2 x multiply-adds). Recomputed
forwards of activation checkpointing are not model FLOPs (MFU, not hardware FLOPs utilisation).

Peak FLOP/s: a table of dense tensor-core peaks of common GPUs (no sparsity), or measured on the machine by a
large matmul in the recipe's precision (CPU, unknown GPUs).
"""

import time

# dense peak TFLOP/s: (fp32, bf16/fp16). fp32 without TF32 on A100/H100 (TF32 is off for matmuls in torch by default)
GPU_PEAK_TFLOPS = {
    "H100 SXM": (67.0, 989.0),
    "H100 PCIe": (51.0, 756.0),
    "H100": (67.0, 989.0),
    "H200": (67.0, 989.0),
    "A100": (19.5, 312.0),
    "A800": (19.5, 312.0),
    "A10G": (31.2, 125.0),
    "A10": (31.2, 125.0),
    "L40S": (91.6, 362.0),
    "L4": (30.3, 121.0),
    "V100": (15.7, 125.0),
    "T4": (8.1, 65.0),
    "RTX 4090": (82.6, 165.0),
    "RTX 3090": (35.6, 71.0),
}


# names torch reports for a card -> its GPU_PEAK_TFLOPS key (the SXM H100 reports its memory, not its form factor)
CARD_ALIASES = {"H100 80GB HBM3": "H100 SXM"}


def card_key(device_name: str) -> str | None:
    """The GPU_PEAK_TFLOPS key of a card name (the longest key the name contains, after CARD_ALIASES); None."""
    name = device_name.lower()
    for alias, key in CARD_ALIASES.items():
        if alias.lower() in name:
            return key
    matches = [key for key in GPU_PEAK_TFLOPS if key.lower() in name]
    return max(matches, key=len) if matches else None


def table_peak(device_name: str, precision: str) -> float | None:
    """Peak FLOP/s of a known GPU by (the longest matching part of) its name, None if unknown."""
    key = card_key(device_name)
    if key is None:
        return None
    fp32, half = GPU_PEAK_TFLOPS[key]
    return (fp32 if precision == "fp32" else half) * 1e12


def measured_peak(device, precision: str, size: int = 1024, seconds: float = 0.5) -> float:
    """FLOP/s of size x size matmuls in the precision's dtype on `device` (the threads torch uses): the best of
    short rounds, so that other processes on a shared machine lower it less."""
    import torch  # here: the planner reads the table without torch (scale.bench.trace_cache)

    dtype = torch.float32 if precision == "fp32" else (torch.bfloat16 if precision == "bf16" else torch.float16)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b  # warm-up
    sync()
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        a @ b
        sync()
        best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best


def device_peak(device, precision: str) -> tuple[float, str]:
    """(peak FLOP/s of one device, where it comes from)."""
    import torch

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = table_peak(name, precision)
        if peak is not None:
            return peak, f"{name} datasheet ({precision})"
    return measured_peak(device, precision), f"measured {precision} matmul on {device.type}"


def step_flops(trace, images: int) -> float:
    """Model FLOPs of one optimizer step over `images` images (per rank or global)."""
    per_image = (3 * trace.student_flops + trace.teacher_flops) / trace.images
    return per_image * images


def mfu(flops: float, seconds: float, peak_per_device: float, devices: int) -> float:
    return flops / seconds / (peak_per_device * devices)
