"""Mixed precision from the recipe and the device: the autocast dtype, and whether fp16 needs a loss scaler.

bf16 runs on CPU and GPU; fp16 needs a GPU (loss scaling); fp32 runs without autocast.
"""

import contextlib
from dataclasses import dataclass

import torch

from scale.errors import UserError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    name: str
    device_type: str

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.name]

    @property
    def mixed(self) -> bool:
        return self.name != "fp32"

    @property
    def needs_loss_scaling(self) -> bool:
        return self.name == "fp16"

    def autocast(self) -> contextlib.AbstractContextManager:
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def resolve_precision(name: str, device: torch.device) -> Precision:
    if name == "fp16" and device.type != "cuda":
        raise UserError("engine.precision=fp16 needs a GPU (loss scaling); use bf16 or fp32 on CPU")
    return Precision(name, device.type)
