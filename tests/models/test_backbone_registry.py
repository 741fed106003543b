"""scale.models.BACKBONES declares every value of model.name with the family module that registers it: the recipe
schema reads the declaration (no family imported), building a backbone imports its own family only."""

import importlib
import json
import subprocess
import sys

import pytest

from scale.models import BACKBONES, FAMILIES, load_families, registry


def test_each_family_registers_exactly_what_is_declared():
    load_families()
    assert sorted(registry._FACTORIES) == sorted(BACKBONES)
    assert set(BACKBONES.values()) <= set(FAMILIES)
    for name, family in BACKBONES.items():  # registered by the module the declaration names
        assert registry._FACTORIES[name].__module__ == importlib.import_module(f"scale.models.{family}").__name__


def test_an_undeclared_name_is_refused():
    with pytest.raises(ValueError, match="'vit_colossal' is not declared"):
        registry.register("vit_colossal")


def test_building_a_backbone_imports_its_family_only():
    probe = (
        "import json, sys; from scale.models.registry import factory_of; factory_of('resnet_nano'); "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('scale.models.'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == ["scale.models.registry", "scale.models.resnet"]


def test_a_meta_build_skips_initialisation_and_keeps_every_shape():
    """building_on("meta"): the value-setting in-place ops of weight initialisation are no-ops on meta tensors (no
    values to set; their meta kernels are slow Python), anything else runs: shapes, and tensors on a real device."""
    import torch
    from torch import nn

    from scale.models.registry import building_on

    calls = []

    class Spy(torch.overrides.TorchFunctionMode):  # entered first: it sees what building_on's mode lets through
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls.append(getattr(func, "__name__", ""))
            return func(*args, **(kwargs or {}))

    with Spy(), building_on("meta"):
        layer = nn.Linear(4, 3)  # kaiming_uniform_ and uniform_ in reset_parameters
        nn.init.trunc_normal_(layer.weight, std=0.02)
        grown = torch.empty(3).unsqueeze_(0)  # not a value setter: applied
        real = torch.zeros(2, device="cpu").fill_(1.5)  # not on meta: applied
    assert layer.weight.is_meta and layer.weight.shape == (3, 4) and grown.shape == (1, 3) and grown.is_meta
    assert real.tolist() == [1.5, 1.5]
    assert "erfinv_" not in calls and "uniform_" not in calls  # stopped before the meta kernels
    with building_on("cpu"):
        ones = nn.init.ones_(torch.empty(2))
    assert ones.tolist() == [1.0, 1.0]  # a real device initialises
