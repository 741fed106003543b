"""engine.loss_scale_power: fp16's dynamic loss scale starts at 2**power in every engine (torch's GradScaler under
DDP, ShardedScaler under FSDP2, DeepSpeed's initial_scale_power). A scale too large for a model's gradients
overflows and skips updates until it has halved enough (seen on an H100: tiny models skipped their first three)."""

import pytest
import torch

from scale.engine.config import EngineConfig, OptimConfig
from scale.engine.ddp import DDPEngine
from scale.engine.fsdp import FSDPEngine
from scale.engine.precision import Precision


@pytest.mark.parametrize("engine_class", [DDPEngine, FSDPEngine])
@pytest.mark.parametrize("power", [16, 8])
def test_the_torch_engines_scalers_start_at_two_to_the_power(engine_class, power):
    engine = engine_class.__new__(engine_class)  # only what make_scaler reads
    engine.cfg = EngineConfig(loss_scale_power=power)
    engine.device = torch.device("cpu")
    assert engine.make_scaler().get_scale() == 2.0**power


def test_deepspeed_starts_at_two_to_the_power():
    pytest.importorskip("deepspeed")
    from scale.engine.deepspeed import ds_config

    config = ds_config(EngineConfig(kind="deepspeed", loss_scale_power=8), OptimConfig(), Precision("fp16", "cuda"))
    assert config["fp16"]["initial_scale_power"] == 8
    assert config["fp16"]["loss_scale"] == 0  # dynamic


def test_the_default_is_torchs_and_deepspeeds():
    assert EngineConfig().loss_scale_power == 16
