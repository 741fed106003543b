"""Load a recipe: find the YAML, follow `base:` inheritance, apply `section.key=value` overrides, validate.

Merging is OmegaConf's; what this module adds is the error messages: every user mistake names the file (or the
command line), the dotted key, and what was expected.
"""

import copy
import dataclasses
import difflib
import functools
import re
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from scale.config.schema import Recipe
from scale.config.validate import Origins, check_recipe
from scale.errors import ConfigError
from scale.resources import recipes_dir

BASE_KEY = "base"
# libyaml's parser where PyYAML was built with it: several times faster on the ~300 recipes the tests load
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
OVERRIDE_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*=")


def recipe_path(name_or_path: str, relative_to: Path | None = None) -> Path:
    """A recipe name (`dino/table2/vit_s16`) or a path to a YAML file."""
    candidates = []
    as_path = Path(name_or_path)
    if relative_to is not None and not as_path.is_absolute():
        candidates.append(relative_to / as_path)
    candidates += [as_path, recipes_dir() / name_or_path, recipes_dir() / f"{name_or_path}.yaml"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise ConfigError(f"recipe not found: '{name_or_path}' (looked for {', '.join(str(c) for c in candidates)})")


def recipe_name(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(recipes_dir().resolve()).with_suffix(""))
    except ValueError:
        return path.stem


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=YAML_LOADER) or {}
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not a text file (byte {err.start} is not UTF-8)") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of sections, got {type(data).__name__}")
    return data


def _field_type(dotted: str) -> Any:
    """The annotated type of a dotted key of the schema, or None for keys inside free-form dicts."""
    cls: Any = Recipe
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(cls):
            return None
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return None
        cls = hints[part]
    return cls


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is not None:
        return str(tp).replace("typing.", "")
    return getattr(tp, "__name__", str(tp))


def _check_keys(raw: dict, schema: DictConfig, where: str, prefix: str = "") -> None:
    """Unknown keys fail naming the key, where it was and the closest valid key."""
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if key not in schema:
            valid = [str(k) for k in schema.keys()]
            close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.5)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; valid keys here: {', '.join(valid)}"
            raise ConfigError(f"{where}: unknown key '{dotted}'{hint}")
        child = schema[key] if not OmegaConf.is_missing(schema, key) else None
        if isinstance(child, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(child)):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: '{dotted}' is a section, expected a mapping, got {value!r}")
            _check_keys(value, child, where, dotted + ".")


@functools.cache
def _schema() -> DictConfig:
    return OmegaConf.structured(Recipe)


def _defaults() -> DictConfig:
    """A fresh copy of the schema's defaults (copying the one built config is ~7x faster than building one)."""
    return copy.deepcopy(_schema())


def _merge(cfg: DictConfig, raw: dict, where: str) -> DictConfig:
    """`raw` merged into `cfg` in place (unsafe_merge: no copy of `cfg`, which the caller no longer uses)."""
    _check_keys(raw, cfg, where)
    try:
        return OmegaConf.unsafe_merge(cfg, raw)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        expected = _field_type(key)
        value = _lookup(raw, key)
        want = f"expected {_type_name(expected)}" if expected is not None else "invalid value"
        raise ConfigError(f"{where}: '{key}': {want}, got {value!r}") from None


def _lookup(raw: dict, dotted: str) -> Any:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return "?"
        node = node[part]
    return node


def _load_chain(path: Path, seen: tuple = ()) -> list[tuple[Path, dict]]:
    """The recipe file and its bases, base-most first."""
    if path in seen:
        raise ConfigError(f"{path}: circular 'base:' chain: {' -> '.join(str(p) for p in seen + (path,))}")
    raw = _read_yaml(path)
    base = raw.pop(BASE_KEY, None)
    chain = []
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(f"{path}: 'base' must be a recipe name or path, got {base!r}")
        chain = _load_chain(recipe_path(base, relative_to=path.parent), seen + (path,))
    return chain + [(path, raw)]


def parse_overrides(overrides: Iterable[str]) -> dict:
    """`section.key=value` strings to a nested dict; values are YAML (so 0.1, true, [1,2] have their types)."""
    overrides = list(overrides)
    for item in overrides:
        if not OVERRIDE_RE.match(item):
            raise ConfigError(f"bad override '{item}': expected section.key=value, e.g. train.epochs=100")
        try:
            OmegaConf.from_dotlist([item])
        except yaml.YAMLError as err:
            problem = str(getattr(err, "problem", None) or err).splitlines()[0]
            raise ConfigError(f"command line: override '{item}': the value is not valid YAML ({problem})") from None
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist(overrides))
    except OmegaConfBaseException as err:
        raise ConfigError(f"bad override: {err}") from None


def load_recipe(name_or_path: str, overrides: Iterable[str] = ()) -> DictConfig:
    """The resolved, validated recipe as a typed OmegaConf config."""
    path = recipe_path(name_or_path)
    cfg = _defaults()
    origins = Origins()
    sources = [(str(file), raw) for file, raw in _load_chain(path)] + [("command line", parse_overrides(overrides))]
    for where, raw in sources:
        cfg = _merge(cfg, raw, where)
        origins.record(raw, where)
    if not cfg.meta.name:
        cfg.meta.name = recipe_name(path)
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{path}: cannot resolve '{getattr(err, 'full_key', '?')}': {err}") from None
    check_recipe(cfg, Recipe, origins)
    return cfg


def from_dict(data: dict) -> DictConfig:
    """A recipe from a plain dict (e.g. the config.yaml saved in a run directory)."""
    return _merge(_defaults(), data, "config")


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg)


def list_recipes() -> list[Path]:
    """Every recipe file except the bases under recipes/_base."""
    root = recipes_dir()
    return sorted(p for p in root.rglob("*.yaml") if "_base" not in p.relative_to(root).parts)
