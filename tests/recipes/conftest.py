import os

import pytest

from scale.config import list_recipes, load_recipe, recipe_name
from scale.recipes.check import missing_pieces
from scale.recipes.smoke import ensure_smoke_data

ALL_RECIPES_ENV = "SCALE_ALL_RECIPES"


def pytest_configure(config):
    config.addinivalue_line("markers", f"slow_recipes: smoke-train every recipe (runs only with {ALL_RECIPES_ENV}=1)")


def smoke_features(cfg) -> set[tuple]:
    """What selects the code a smoke run exercises: the method, the model family, the engine,
    precision, activation checkpointing, view kind, local crops or none, fine-tuning from weights, the k-NN monitor
    and the optimizer. Sizes and numbers select nothing (the engines and the methods on every backbone family have
    their own in-process tests)."""
    family = cfg.model.name.split("_")[0] + ("_bn" if cfg.model.name.startswith("vit_bn") else "")
    return {
        ("method", cfg.method.kind),
        ("family", family),
        ("engine", cfg.engine.kind),
        ("precision", cfg.engine.precision),
        ("activation checkpointing", cfg.engine.activation_checkpointing),
        ("views", cfg.data.views.kind),
        ("local crops", any(n > 0 for n in cfg.data.views.n_local)),
        ("init weights", bool(cfg.train.init_weights)),
        ("knn monitor", cfg.train.knn_monitor_every > 0),
        ("optimizer", cfg.optim.name),
    }


# recipes that another test trains end to end, through the same `scale train` on 2 ranks: tests/demo's stories
TRAINED_ELSEWHERE = ("demo/",)


def smoke_params() -> list:
    """Every runnable recipe: by default those that bring a feature (smoke_features) no earlier recipe brought, the
    others marked slow_recipes (run with SCALE_ALL_RECIPES=1)."""
    covered, params = set(), []
    run_all = os.environ.get(ALL_RECIPES_ENV) == "1"
    for path in list_recipes():
        cfg = load_recipe(str(path))
        if missing_pieces(cfg):
            continue
        name, features = recipe_name(path), smoke_features(cfg)
        if features <= covered or name.startswith(TRAINED_ELSEWHERE):
            marks = [
                pytest.mark.slow_recipes,
                pytest.mark.skipif(not run_all, reason=f"set {ALL_RECIPES_ENV}=1 to smoke-run every recipe"),
            ]
            params.append(pytest.param(name, marks=marks, id=name))
        else:
            params.append(pytest.param(name, id=name))
        covered |= features
    return params


@pytest.fixture(scope="session")
def smoke_data(embedded_data):
    return ensure_smoke_data(embedded_data / "embedded")  # the session's photos: nothing left to build
