"""Schedules indexed by the global optimizer step (0-based), precomputed as arrays like the official DINO code.

A `Schedule` clamps steps past its end to its last value, so a run resumed with more steps than planned (or a
loop that evaluates one step past the end) never indexes out of range.
"""

import math
from collections.abc import Callable

import numpy as np


class Schedule:
    def __init__(self, values: np.ndarray):
        if len(values) == 0:
            raise ValueError("a schedule needs at least one step")
        self.values = np.asarray(values, dtype=np.float64)

    def __call__(self, step: int) -> float:
        return float(self.values[min(max(step, 0), len(self.values) - 1)])

    def __len__(self) -> int:
        return len(self.values)


def cosine(
    base: float,
    final: float,
    total_steps: int,
    warmup_steps: int = 0,
    warmup_start: float = 0.0,
    warmup_endpoint: bool = True,
    warmup_prefix: bool = True,
) -> Schedule:
    """Linear warmup from `warmup_start` to `base` over `warmup_steps`, then a half cosine from `base` to `final`
    (DINO's `cosine_scheduler`: value at step t after warmup = final + (base-final)/2 * (1 + cos(pi t / T))).
    `warmup_endpoint`: DINO's `np.linspace(start, base, warmup_iters)` reaches `base` at the last warmup step; False
    gives start + (base - start) * t / warmup_steps, MoCo v3's `adjust_learning_rate` and timm's warmup (DRLoc).
    `warmup_prefix` False: timm's CosineLRScheduler without `warmup_prefix`, whose cosine counts t from step 0 over
    all `total_steps` (T = total_steps, t = the step itself) and whose warmup replaces its first steps."""
    warmup_steps = min(warmup_steps, total_steps)
    warmup = np.linspace(warmup_start, base, warmup_steps, endpoint=warmup_endpoint) if warmup_steps else np.zeros(0)
    if warmup_prefix:
        steps, length = np.arange(total_steps - warmup_steps), max(total_steps - warmup_steps, 1)
    else:
        steps, length = np.arange(warmup_steps, total_steps), total_steps
    decay = final + 0.5 * (base - final) * (1 + np.cos(np.pi * steps / length))
    return Schedule(np.concatenate([warmup, decay]))


def constant(value: float, total_steps: int) -> Schedule:
    return Schedule(np.full(max(total_steps, 1), value))


def scaled_lr(base_lr: float, global_batch: int, ref_batch: int, rule: str) -> float:
    """The learning-rate scaling rules of the papers: linear (DINO, MoCo v3: lr * B / 256), sqrt, or none."""
    ratio = global_batch / ref_batch
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    if rule == "none":
        return base_lr
    raise ValueError(f"optim.lr_scaling: unknown rule '{rule}' (expected linear, sqrt or none)")


def teacher_temperature(warmup_temp: float, temp: float, warmup_epochs: int, epochs: int) -> np.ndarray:
    """DINO's teacher temperature per EPOCH: linear from `warmup_temp` to `temp` over `warmup_epochs`, then constant.
    Unlike the official code this does not crash when `epochs < warmup_epochs` (the warmup is just cut short)."""
    epochs = max(epochs, 1)
    warmup = np.linspace(warmup_temp, temp, warmup_epochs) if warmup_epochs > 0 else np.zeros(0)
    return np.concatenate([warmup, np.full(max(epochs - warmup_epochs, 0), temp)])[:epochs]


def moco_momentum(base: float, epoch_float: float, epochs: int) -> float:
    """MoCo v3's per-iteration momentum: m = 1 - (1 + cos(pi * epoch / epochs)) / 2 * (1 - m0)."""
    return 1.0 - 0.5 * (1.0 + math.cos(math.pi * epoch_float / epochs)) * (1.0 - base)


def encoder_momentum(base: float, cosine: bool, steps_per_epoch: int, total_steps: int) -> Callable[[int], float]:
    """The momentum encoder's coefficient (MoCo v2/v3, BYOL) for the EMA update after optimizer step t: `base`, or
    with `cosine` MoCo v3's per-iteration cosine to 1 (`moco_momentum`) at iteration t + 1, as the official code
    updates the momentum encoder at the start of the next iteration, with that iteration's fractional epoch."""
    if not cosine:
        return lambda step: base
    epochs = math.ceil(total_steps / steps_per_epoch)
    return lambda step: moco_momentum(base, (step + 1) / steps_per_epoch, epochs)


def lr_schedule(optim, global_batch: int, steps_per_epoch: int, total_steps: int) -> Schedule:
    """The learning rate of recipe section `optim` (OptimConfig) at each step: scaled base lr, linear warmup over
    `warmup_epochs`, cosine to `min_lr` over `lr_schedule_epochs` (default: the trained epochs). With `lr_step:
    epoch` the schedule counts epochs and each epoch's steps share its value (timm's scheduler in DeiT); `lr_lag`
    units late, its first value repeated (timm's scheduler sets the lr of the next step or epoch)."""
    peak = scaled_lr(optim.lr, global_batch, optim.ref_batch, optim.lr_scaling)
    units_per_epoch = 1 if optim.lr_step == "epoch" else steps_per_epoch
    trained_epochs = total_steps / steps_per_epoch
    span = math.ceil((optim.lr_schedule_epochs or trained_epochs) * units_per_epoch)
    warmup = int(round(optim.warmup_epochs * units_per_epoch))
    values = cosine(
        peak, optim.min_lr, span, warmup, optim.warmup_start_lr, optim.warmup_endpoint, optim.warmup_prefix
    ).values
    values = np.concatenate([np.full(optim.lr_lag, values[0]), values])
    if optim.lr_step == "epoch":
        values = np.repeat(values, steps_per_epoch)
    return Schedule(values)


def wd_schedule(optim, total_steps: int) -> Schedule:
    """Weight decay cosine from `weight_decay` to `weight_decay_end` (DINO 0.04 -> 0.4; equal ends: constant)."""
    return cosine(optim.weight_decay, optim.weight_decay_end, total_steps)
