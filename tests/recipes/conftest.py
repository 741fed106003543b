import functools
import os

import pytest

from scale.config import list_recipes, recipe_name
from scale.recipes.check import missing_pieces
from scale.recipes.smoke import ensure_smoke_data
from tests.helpers_recipes import loaded_recipe

ALL_RECIPES_ENV = "SCALE_ALL_RECIPES"


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
    """Every recipe, by name: listing them loads none (loading all ~320 took ~51 CPU s in each process that
    collects the tests, the xdist workers of `make test` and of `make test-oldest`); smoke_skips chooses, at run time
    and once per process, which of them run."""
    return [pytest.param(name, id=name) for name in map(recipe_name, list_recipes())]


@functools.cache
def smoke_skips() -> dict[str, str]:
    """Why test_smoke_run skips a recipe, by name: it cannot run here (missing_pieces), or, by default, it is not
    among the fewest recipes that together bring every feature (smoke_features) the demo recipes do not (chosen
    greedily: the recipe bringing the most features not yet brought, the first in name order on a tie; all run with
    SCALE_ALL_RECIPES=1)."""
    skips, candidates, covered = {}, {}, set()
    for path in list_recipes():
        name = recipe_name(path)
        cfg = loaded_recipe(name)
        if missing_pieces(cfg):  # one reason for all, one line of -ra's summary
            skips[name] = "cannot smoke-run: needs a part not built yet (`scale recipes check` names it)"
        elif name.startswith(TRAINED_ELSEWHERE):
            covered |= smoke_features(cfg)
            skips[name] = "trained end to end by tests/demo"
        else:
            candidates[name] = smoke_features(cfg)
    if os.environ.get(ALL_RECIPES_ENV) == "1":
        return {name: why for name, why in skips.items() if not name.startswith(TRAINED_ELSEWHERE)}
    chosen = []
    while any(features - covered for features in candidates.values()):
        best = max(candidates, key=lambda name: len(candidates[name] - covered))  # max keeps the first of a tie
        chosen.append(best)
        covered |= candidates.pop(best)
    why = f"the recipes smoke-run cover its code paths: set {ALL_RECIPES_ENV}=1 to smoke-run every recipe"
    return skips | dict.fromkeys(candidates, why)


@pytest.fixture(scope="session")
def smoke_data(embedded_data):
    return ensure_smoke_data(embedded_data / "embedded")  # the session's photos: nothing left to build
