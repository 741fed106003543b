"""engine.compile_mode=reduce-overhead on CUDA: inductor's CUDA graph trees under the real training step (the demo
DINO recipe, tiny ViT, 2 global + 2 local crops, DDP, bf16, one process). Each step is one generation of the trees
(scale.engine.compile.begin_graph_step): without it the teacher's no-grad blocks read outputs that the next block's
replay had overwritten, and DINO ViT-S/16 failed in its first recorded step on an H200 (2026-11-28). Here four steps
run (the trees warm up, record, then replay), no graph is skipped, and the losses and weights equal those of the same
compiled step without CUDA graphs (the same inductor kernels, launched one by one) within bf16 rounding, with each
block compiled (engine.compile_scope=blocks) and with each net compiled whole (net).

CUDA graphs exist on CUDA only: the CPU self-check skips it (the marking itself: tests/loop/test_step_sync.py)."""

import pytest
import torch
from gpu_env import require_cuda
from torch._dynamo.utils import counters

from scale.config import load_recipe
from scale.data.synthetic import SyntheticLoader
from scale.loop.step import TrainStep, read_record
from tests.loop.test_step_guard import TINY, state

pytestmark = pytest.mark.gpu

STEPS = 4


def train(group, mode: str, scope: str) -> dict:
    info, device = group
    torch._dynamo.reset()
    counters.clear()
    overrides = [*TINY, "engine.kind=ddp", "engine.precision=bf16", "engine.compile=true"]
    overrides += [f"engine.compile_mode={mode}", f"engine.compile_scope={scope}"]
    overrides += ["train.grad_monitor_every=0", "data.prefetch_to_device=false"]
    cfg = load_recipe("demo/dino_tiny", overrides)
    step = TrainStep(cfg, info, device, lambda: SyntheticLoader(cfg, info.rank, info.world_size))
    batches = step.batches()
    losses = [read_record(step(i, step.next_batch(batches)[0]))["loss"] for i in range(STEPS)]
    return {"losses": losses, "state": state(step), "inductor": dict(counters["inductor"])}


@pytest.mark.parametrize("scope", ["blocks", "net"])
def test_cuda_graph_steps_train_as_the_same_compiled_step_without_them(group, scope):
    require_cuda("CUDA graphs")
    plain, graphs = train(group, "default", scope), train(group, "reduce-overhead", scope)
    assert graphs["inductor"].get("cudagraph_skips", 0) == 0, graphs["inductor"]
    assert torch.isfinite(torch.tensor(graphs["losses"])).all()
    assert graphs["losses"] == pytest.approx(plain["losses"], rel=1e-2)
    assert graphs["state"].keys() == plain["state"].keys()
    for name, value in plain["state"].items():
        if value.is_floating_point():
            torch.testing.assert_close(graphs["state"][name], value, rtol=1e-2, atol=1e-3, msg=name)
