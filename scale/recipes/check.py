"""`scale recipes check`: load every recipe, build its method on the meta device, compare parameter counts.

A row fails when it does not load, when a part it needs is not built yet (a backbone that is not
registered, an engine module that does not exist, or a `missing: ...` line in `meta.notes`), when its method does
not build, when the backbone's parameter count is outside the paper's rounding of `meta.reported.params_m`, or when
a stated value differs from its recorded source or has none (scale.recipes.provenance).
"""

import importlib.util
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from scale.config import load_recipe, recipe_name
from scale.config.load import defaults
from scale.engine.kinds import KINDS as ENGINE_KINDS
from scale.errors import UserError
from scale.recipes.provenance import source_errors, written_keys

MISSING_PREFIX = "missing:"
IN1K_CLASSES = 1000  # DRLoc quotes the original papers' counts: backbone + ImageNet-1K classifier


@dataclass
class CheckResult:
    name: str
    ok: bool
    message: str = ""
    params_m: float | None = None  # the backbone's parameters, millions
    missing: list[str] = field(default_factory=list)


def missing_pieces(cfg: DictConfig) -> list[str]:
    """What this recipe needs that the code base does not have yet, each named for a reader."""
    from scale.models import available

    missing = []
    if cfg.model.name not in available():
        missing.append(f"backbone '{cfg.model.name}' (model.name; not registered in scale.models)")
    module = ENGINE_KINDS[cfg.engine.kind][0] if cfg.engine.kind in ENGINE_KINDS else None
    if module is None or importlib.util.find_spec(module) is None:
        missing.append(f"engine '{cfg.engine.kind}' (engine.kind; no module {module or '?'})")
    for line in cfg.meta.notes.splitlines():
        if line.strip().lower().startswith(MISSING_PREFIX):
            missing.append(line.strip()[len(MISSING_PREFIX) :].strip())
    return missing


def within_rounding(ours: float, reported: float) -> bool:
    """True when the paper's number is ours rounded down or up at the paper's precision (papers do both: DINO
    quotes ViT-S 21.7M as 21, MoCo v3 as 22)."""
    text = repr(float(reported))
    decimals = 0 if text.endswith(".0") else len(text.split(".")[1])
    unit = 10.0**-decimals
    low, high = math.floor(ours / unit + 1e-9) * unit, math.ceil(ours / unit - 1e-9) * unit
    return low - 1e-9 <= reported <= high + 1e-9


def count_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _param_errors(cfg: DictConfig, built: tuple[int, int]) -> tuple[float, list[str]]:
    """`built`: the backbone's parameter count and embedding width (_build_on_meta)."""
    params = built[0] / 1e6
    checks = {"params_m": params}
    if "params_m_in1k_classifier" in cfg.meta.reported:
        checks["params_m_in1k_classifier"] = params + (built[1] + 1) * IN1K_CLASSES / 1e6
    errors = []
    for key, ours in checks.items():
        reported = cfg.meta.reported.get(key)
        if reported is not None and not within_rounding(ours, float(reported)):
            errors.append(f"meta.reported.{key}={reported} but the model has {ours:.2f}M parameters")
    return params, errors


def _build_key(cfg: DictConfig) -> str:
    """What the meta build depends on: many rows share it (e.g. one Swin-T DRLoc model over ten data sets)."""
    return OmegaConf.to_yaml(
        {
            "model": cfg.model,
            "method": cfg.method,
            "data": {"num_classes": cfg.data.num_classes},
            "train": {"epochs": cfg.train.epochs},
        }
    )


@cache  # two ints a build: every distinct build of a `scale recipes check` run is kept
def _build_on_meta(key: str) -> tuple[int, int]:
    """The recipe's method on the meta device (heads, predictors and method options are validated where they are
    built); returns the student backbone's parameter count and embedding width. Raises UserError."""
    from scale.methods import build_method
    from scale.models import build_backbone

    # a copy of the schema's defaults, not OmegaConf.structured(Recipe): building that was ~40% of a build
    cfg = OmegaConf.unsafe_merge(defaults(), OmegaConf.create(key))
    built = []

    def backbone_fn(drop_path=None):
        built.append(build_backbone(cfg.model, drop_path=drop_path, device="meta"))
        return built[-1]

    build_method(cfg, steps_per_epoch=1, total_steps=max(1, cfg.train.epochs), device="meta", backbone_fn=backbone_fn)
    return count_params(built[0]), built[0].embed_dim


def check_config(name: str, cfg: DictConfig, written: set[str] = frozenset()) -> CheckResult:
    """`written`: the keys the recipe's files write (each must be sourced, scale.recipes.provenance)."""
    sourcing = source_errors(cfg, written)
    missing = missing_pieces(cfg)
    if missing:
        return CheckResult(name, False, "; ".join(["needs " + "; ".join(missing), *sourcing]), missing=missing)
    try:
        params, errors = _param_errors(cfg, _build_on_meta(_build_key(cfg)))
    except UserError as err:
        return CheckResult(name, False, "; ".join([str(err), *sourcing]))
    if errors or sourcing:
        return CheckResult(name, False, "; ".join(errors + sourcing), params_m=params)
    return CheckResult(name, True, params_m=params)


def check_recipe(path: Path | str) -> CheckResult:
    name = recipe_name(Path(path))
    try:
        cfg = load_recipe(str(path))
        written = written_keys(str(path))
    except UserError as err:
        return CheckResult(name, False, str(err))
    return check_config(name, cfg, written)
