"""block_modules() as activation-checkpointing units: wrapping them in place changes no output or gradient."""

import copy
from functools import partial

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

from scale.models import build_backbone
from scale.models.config import ModelConfig


@pytest.mark.parametrize("name,size", [("vit_nano", 32), ("vit_bn_nano", 32), ("swin_nano", 96), ("resnet_nano", 64)])
def test_checkpointed_blocks_give_same_outputs_and_grads(name, size):
    torch.manual_seed(0)
    model = build_backbone(ModelConfig(name=name, img_size=64 if name.startswith("vit") else 224), drop_path=0.0)
    wrapped = copy.deepcopy(model)
    blocks = {id(m) for m in wrapped.block_modules()}
    apply_activation_checkpointing(
        wrapped,
        checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: id(m) in blocks,
    )
    assert len(wrapped.block_modules()) == len(blocks)
    assert all(type(m).__name__ == "CheckpointWrapper" for m in wrapped.block_modules())
    x = torch.randn(2, 3, size, size)
    ref, out = model(x), wrapped(x)
    torch.testing.assert_close(out["tokens"], ref["tokens"])
    (ref["pooled"].square().sum() + ref["tokens"].sum()).backward()
    (out["pooled"].square().sum() + out["tokens"].sum()).backward()
    for (key, a), b in zip(model.named_parameters(), wrapped.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, msg=key)
    assert len(wrapped.forward_last_blocks(x, 2)) == 2
