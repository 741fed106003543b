"""Every recipe loaded once per test process: the modules that read all ~320 recipes as they are (no overrides) share
one load of each (~0.1-0.25 CPU s a recipe; those modules loaded them four times over). tests/conftest.py runs
them in one xdist unit (EVERY_RECIPE) so that they share this cache."""

import functools

from omegaconf import DictConfig, OmegaConf

from scale.config import load_recipe
from scale.config.load import recipe_path


def loaded_recipe(name: str) -> DictConfig:
    """load_recipe(name), one config shared by every caller and read-only: a caller that changes it raises
    ReadonlyConfigError (a fresh copy for each caller cost ~23 CPU ms, four callers a recipe)."""
    return _loaded(str(recipe_path(name)))


@functools.cache
def _loaded(path: str) -> DictConfig:
    # keyed by the file (SCALE_RECIPES may point a name elsewhere); a recipe that fails to load raises every time
    cfg = load_recipe(path)
    OmegaConf.set_readonly(cfg, True)
    return cfg
