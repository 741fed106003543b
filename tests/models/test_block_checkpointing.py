"""Activation checkpointing as scale applies it (scale.engine.activation_checkpointing, torch's composable `checkpoint` on the
backbone's block_modules()): the chosen blocks run their forward again in the backward, the others do not, and
outputs and gradients are those of the plain model."""

import copy

import pytest
import torch

from scale.engine.activation_checkpointing import apply_activation_checkpointing
from scale.models import build_backbone
from scale.models.config import ModelConfig


def _count_forwards(blocks) -> list[int]:
    """How often each block's forward runs (the recomputation in the backward calls forward without hooks)."""
    counts = [0] * len(blocks)

    def counting(index, forward):
        def run(*args, **kwargs):
            counts[index] += 1
            return forward(*args, **kwargs)

        return run

    for index, block in enumerate(blocks):
        block.forward = counting(index, block.forward)
    return counts


@pytest.mark.parametrize("name,size", [("vit_nano", 32), ("vit_bn_nano", 32), ("swin_nano", 96), ("resnet_nano", 64)])
@pytest.mark.parametrize("mode,every_n", [("full", 1), ("every_n", 2)])
def test_chosen_blocks_recompute_and_outputs_and_grads_are_unchanged(name, size, mode, every_n):
    torch.manual_seed(0)
    model = build_backbone(ModelConfig(name=name, img_size=64 if name.startswith("vit") else 224), drop_path=0.0)
    wrapped = copy.deepcopy(model)
    blocks = list(wrapped.block_modules())
    counts = _count_forwards(blocks)
    # the engines apply it to a method's network, whose parts (backbone, head) are searched for block_modules()
    chosen = apply_activation_checkpointing(torch.nn.ModuleList([wrapped]), mode, every_n)
    expected = [2 if mode == "full" or i % every_n == 0 else 1 for i in range(len(blocks))]
    assert chosen == expected.count(2) and list(wrapped.block_modules()) == blocks  # in place, same modules

    x = torch.randn(2, 3, size, size)
    ref, out = model(x), wrapped(x)
    torch.testing.assert_close(out["tokens"], ref["tokens"])
    (ref["pooled"].square().sum() + ref["tokens"].sum()).backward()
    (out["pooled"].square().sum() + out["tokens"].sum()).backward()
    assert counts == expected  # a checkpointed block's forward ran once more, in the backward
    assert [k for k, _ in model.named_parameters()] == [k for k, _ in wrapped.named_parameters()]
    for (key, a), b in zip(model.named_parameters(), wrapped.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, msg=key)
    assert len(wrapped.forward_last_blocks(x, 2)) == 2


def test_mode_none_checkpoints_nothing():
    model = build_backbone(ModelConfig(name="vit_nano", img_size=32), drop_path=0.0)
    counts = _count_forwards(list(model.block_modules()))
    assert apply_activation_checkpointing(torch.nn.ModuleList([model]), "none", 2) == 0
    model(torch.randn(1, 3, 32, 32))["pooled"].sum().backward()
    assert set(counts) == {1}
