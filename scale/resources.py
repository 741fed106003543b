"""The files scale ships beside its code: the recipes and the Slurm job template (scale/share/, package data).

Found through importlib.resources, so an editable checkout, an installed wheel and an sdist build all find them the
same way; the checkout's top-level `recipes` and `slurm` are symlinks into scale/share for the paths the docs use.
"""

import os
from importlib.resources import files
from pathlib import Path

from scale.errors import ConfigError

RECIPES_ENV = "SCALE_RECIPES"


def _shipped(*parts: str) -> Path:
    # a wheel installs unpacked, so the package's files are on disk (recipes `base:` each other by path)
    return Path(str(files("scale").joinpath("share", *parts)))


def recipes_dir() -> Path:
    """The recipe tree: $SCALE_RECIPES (a folder that replaces the shipped tree) or the recipes scale ships."""
    env = os.environ.get(RECIPES_ENV)
    if not env:
        return _shipped("recipes")
    if not Path(env).is_dir():
        raise ConfigError(
            f"${RECIPES_ENV}={env}: not a folder (it replaces the recipes scale ships; unset it to use those)"
        )
    return Path(env)


def slurm_template() -> Path:
    """The sbatch template `scale submit` renders unless --template names another."""
    return _shipped("slurm", "train.sbatch.j2")
