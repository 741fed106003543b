import math

import pytest
import torch
from torch import nn

from scale.methods.grad_spikes import GradSpikeDetector, layer_grad_norms, layer_name


def test_layer_names():
    assert layer_name("module.backbone.blocks.3.attn.qkv.weight") == "backbone.blocks.3"
    assert layer_name("backbone.patch_embed.proj.weight") == "backbone.patch_embed.proj"
    assert layer_name("backbone.cls_token") == "backbone"
    assert layer_name("scale") == "scale"


def test_layer_grad_norms_and_spike():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    detector = GradSpikeDetector(ratio=5.0, window=10, min_history=3)
    x = torch.randn(5, 3)
    for _ in range(4):
        model.zero_grad()
        model(x).sum().backward()
        metrics = detector(model)
        assert metrics["grad_spikes"] == 0
    norms = layer_grad_norms(model)
    expected = math.sqrt(model[0].weight.grad.pow(2).sum() + model[0].bias.grad.pow(2).sum())
    assert set(norms) == {"0", "2"} and norms["0"] == pytest.approx(expected)
    model.zero_grad()
    (100 * model(x).sum()).backward()  # a sudden 100x gradient: every layer spikes
    metrics = detector(model)
    assert metrics["grad_spikes"] == 2 and metrics["grad_norm_first_layer"] == pytest.approx(100 * norms["0"], rel=1e-4)
    restored = GradSpikeDetector(window=10)
    restored.load_state_dict(detector.state_dict())
    assert list(restored.history["0"]) == list(detector.history["0"])
