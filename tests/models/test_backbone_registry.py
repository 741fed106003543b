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
