import os

import pytest

from scale.config import list_recipes, load_recipe, recipe_name
from scale.recipes.check import missing_pieces
from scale.recipes.smoke import ensure_smoke_data

ALL_RECIPES_ENV = "SCALE_ALL_RECIPES"


def pytest_configure(config):
    config.addinivalue_line("markers", f"slow_recipes: smoke-train every recipe (runs only with {ALL_RECIPES_ENV}=1)")


def smoke_key(cfg) -> tuple:
    """One smoke run stands for every recipe with the same method (and MoCo framework) and model family: those
    select most of the code that runs (the engines have their own parity tests); sizes and numbers do not."""
    variant = cfg.method.moco.variant if cfg.method.kind == "mocov3" else ""
    family = cfg.model.name.split("_")[0] + ("_bn" if cfg.model.name.startswith("vit_bn") else "")
    return cfg.method.kind, variant, family


def smoke_params() -> list:
    """Every runnable recipe: the first of each smoke_key by default, the others marked slow_recipes."""
    seen, params = set(), []
    run_all = os.environ.get(ALL_RECIPES_ENV) == "1"
    for path in list_recipes():
        cfg = load_recipe(str(path))
        if missing_pieces(cfg):
            continue
        key = smoke_key(cfg)
        name = recipe_name(path)
        if key in seen:
            marks = [
                pytest.mark.slow_recipes,
                pytest.mark.skipif(not run_all, reason=f"set {ALL_RECIPES_ENV}=1 to smoke-run every recipe"),
            ]
            params.append(pytest.param(name, marks=marks, id=name))
        else:
            seen.add(key)
            params.append(pytest.param(name, id=name))
    return params


@pytest.fixture(scope="session")
def smoke_data(embedded_data):
    return ensure_smoke_data(embedded_data / "embedded")  # the session's photos: nothing left to build
