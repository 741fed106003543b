"""scale.bench.plan's memory model, in process: the weights held in the autocast dtype."""

from pathlib import Path

import pytest

from scale.bench.plan import Setting, activation_bytes, predict
from scale.bench.trace import trace_step
from scale.config import load_recipe

TINY_RECIPE = str(Path(__file__).with_name("tiny_dino.yaml"))

# the tiny recipe's nets (ViT-nano/8: D=64, 3 blocks, MLP 256; DINO head 64 -> 128 -> 128 -> 64, its weight-normed
# last layer computed in fp32, not kept), as (weight, bias) elements of each Linear and Conv
EMBED = [(3 * 8 * 8 * 64, 64)]
BLOCK = [(64 * 192, 192), (64 * 64, 64), (64 * 256, 256), (256 * 64, 64)]  # qkv, proj, fc1, fc2
HEAD = [(64 * 128, 128), (128 * 128, 128), (128 * 64, 64)]
LAYERS = EMBED + 3 * BLOCK + HEAD
CAST = sum(w + b for w, b in LAYERS)  # the same in the student (all trainable) and the teacher


def test_the_weights_in_the_autocast_dtype_are_counted_where_the_engine_holds_them():
    """DDP in bf16 keeps 2-byte copies of the student's trainable and the teacher's Linear and Conv weights and
    biases (scale.engine.lowp) between steps; compiled, or another engine, leaves the casts to autocast, whose casts
    of the student's weights (not the biases: addmm saves no bias) live from the forward to the backward, once per
    step whatever the batch; sharded engines gather weights as transients; fp32 casts nothing."""
    trace = trace_step(load_recipe(TINY_RECIPE, ["engine.kind=ddp", "engine.precision=bf16"]))
    assert trace.student_cast == trace.teacher_cast == CAST
    assert trace.weight_casts == 2 * sum(w for w, _ in LAYERS)

    def memory(engine: str, precision: str = "bf16", compiled: bool = False, batch: int = 4) -> dict:
        setting = Setting(engine, micro_batch=batch, compile=compiled)
        return predict(trace, setting, 2, precision, "adamw", 1e12, 1.0, 1e9).memory

    held, autocast = memory("ddp"), memory("ddp", compiled=True)
    assert held["lowp"] == 2 * (CAST + CAST)
    assert autocast["lowp"] == trace.weight_casts
    assert held["total"] - autocast["total"] == pytest.approx(2 * (CAST + CAST) - trace.weight_casts)
    assert memory("zero2")["lowp"] == trace.weight_casts
    assert memory("fsdp2")["lowp"] == memory("zero3")["lowp"] == memory("ddp", "fp32")["lowp"] == 0
    # batch-independent: not among the activations, which grow with the batch
    assert memory("ddp", batch=8)["lowp"] == held["lowp"]
    assert activation_bytes(trace, 8) == pytest.approx(2 * activation_bytes(trace, 4))
