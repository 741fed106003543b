"""Load a recipe: find the YAML, follow `base:` inheritance, apply `section.key=value` overrides, validate.

Merging is OmegaConf's; what this module adds is the error messages: every user mistake names the file (or the
command line), the dotted key, and what was expected.
"""

import collections
import dataclasses
import difflib
import functools
import hashlib
import pickle
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
from scale.errors import ConfigError, notice
from scale.methods.config import MOVED_KEYS, moco_key
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
    close = [] if relative_to else difflib.get_close_matches(name_or_path, map(recipe_name, list_recipes()), n=1)
    hint = f"did you mean '{close[0]}'?" if close else "`scale recipes list` lists them"
    looked = ", ".join(str(c) for c in candidates)
    raise ConfigError(f"recipe not found: '{name_or_path}' (looked for {looked}); {hint}")


def recipe_name(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(recipes_dir().resolve()).with_suffix(""))
    except ValueError:
        return path.stem


# a recipe has a few hundred YAML nodes; anchors and aliases nested in each other (a "billion laughs" bomb) expand
# to billions of them in the merge, which would run for hours: refused before anything expands them
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 64
MAX_BASE_DEPTH = 32  # files in a `base:` chain


def _expanded_size(node: yaml.Node, where: Path, memo: dict, depth: int = 0) -> int:
    """The number of nodes `node` becomes once its aliases are expanded (each aliased node counted once per use)."""
    if id(node) in memo:
        if memo[id(node)] is None:
            raise ConfigError(f"{where}: a YAML alias refers to a node that contains it (a recursive structure)")
        return memo[id(node)]
    if depth > MAX_YAML_DEPTH:
        raise ConfigError(f"{where}: YAML nested more than {MAX_YAML_DEPTH} levels deep")
    memo[id(node)] = None  # being counted
    children = node.value if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)) else []
    if isinstance(node, yaml.MappingNode):
        children = [item for pair in children for item in pair]
    total = 1
    for child in children:
        total += _expanded_size(child, where, memo, depth + 1)
        if total > MAX_YAML_NODES:
            raise ConfigError(
                f"{where}: its YAML anchors and aliases expand to more than {MAX_YAML_NODES:,} values (a YAML bomb?); "
                f"refused. Write the values out, or use fewer nested aliases"
            )
    memo[id(node)] = total
    return total


def parse_yaml(text: str, where: Path):
    """yaml.load with the expansion of aliases bounded (see MAX_YAML_NODES)."""
    loader = YAML_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, where, {})
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _read_yaml(path: Path) -> dict:
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"), path) or {}
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


def _copy(pickled: bytes) -> DictConfig:
    """A config from pickle.dumps of one this process built (never bytes read from outside): unpickling a config
    is ~4x faster than copy.deepcopy of it (OmegaConf copies node by node in Python), and gives the same config."""
    return pickle.loads(pickled)


@functools.cache
def _schema_pickled() -> bytes:
    return pickle.dumps(_schema())


def defaults() -> DictConfig:
    """A fresh copy of the schema's defaults (copying the one built config is much faster than building one)."""
    return _copy(_schema_pickled())


def _renamed(raw: dict, where: str) -> dict:
    """`raw` in today's spelling: method.kind=mocov3 with method.moco.variant=X (before each framework was a kind of
    its own, scale/methods/registry.py) is method.kind=X. Recipes and the config.yaml of older runs still load."""
    moco = raw.get("method", {}).get("moco") if isinstance(raw.get("method"), dict) else None
    if not isinstance(moco, dict) or "variant" not in moco:
        return raw
    method = {**raw["method"], "moco": {k: v for k, v in moco.items() if k != "variant"}}
    method["kind"] = moco["variant"] if method.get("kind", "mocov3") == "mocov3" else method["kind"]
    notice(f"{where}: method.moco.variant is deprecated: write method.kind={method['kind']} (read as such)")
    return {**raw, "method": method}


def _final_kind(layers: list[dict]) -> Any:
    """The method.kind the merged layers end with (the schema's default where none sets it)."""
    kinds = [raw["method"]["kind"] for raw in layers if isinstance(raw.get("method"), dict) and "kind" in raw["method"]]
    return kinds[-1] if kinds else _schema().method.kind


def _today(dotted: str, kind: Any) -> str | None:
    """Where a method key of an earlier release is read today with method.kind=`kind` (None: nowhere, `kind` never
    read it); every other key as it is."""
    parts = dotted.split(".")
    if len(parts) != 3 or parts[0] != "method":
        return dotted
    section, key = parts[1:]
    if section == "moco":
        new = moco_key(kind, key) if isinstance(kind, str) else None
        return f"method.{kind}.{new}" if new else None
    owner = MOVED_KEYS.get(section, {}).get(key)
    return f"method.{owner}.{key}" if owner else dotted


def _old_sections(raw: dict, kind: Any, where: str) -> dict:
    """`raw` with the method sections of earlier releases read as today's (scale/methods/config.py MOVED_KEYS,
    moco_key): method.moco.X as method.<kind>.X, method.dino.region_* as method.esvit.region_*, the `sources`
    entries of those keys likewise; one deprecation notice per file naming the old and the new keys. A run's
    config.yaml written before each kind had its own section still loads, and still resumes."""
    method = raw.get("method") if isinstance(raw.get("method"), dict) else {}
    sources = raw.get("sources") if isinstance(raw.get("sources"), dict) else {}
    old = [f"method.{s}.{k}" for s, v in method.items() if isinstance(v, dict) for k in v]
    moves = {key: _today(key, kind) for key in dict.fromkeys(old + [k for k in sources if isinstance(k, str)])}
    moves = {key: new for key, new in moves.items() if new != key}
    if not moves and method.get("moco") != {}:
        return raw
    method = {s: dict(v) if isinstance(v, dict) else v for s, v in method.items()}
    for key, new in moves.items():
        _, section, name = key.split(".")
        if isinstance(method.get(section), dict) and name in method[section]:
            value = method[section].pop(name)
            target = method.setdefault(new.split(".")[1], {}) if new is not None else None
            if isinstance(target, dict):  # (not a mapping: the loader names that section)
                target.setdefault(new.split(".")[2], value)  # the file's own new spelling wins
    if method.get("moco") == {}:
        del method["moco"]  # a section no release reads any more (emptied, or by the `variant` rename)
    raw = {**raw, "method": method} if isinstance(raw.get("method"), dict) else dict(raw)
    if sources:
        raw["sources"] = {moves.get(k, k): v for k, v in sources.items() if k not in moves or moves[k] is not None}
    if moves:
        notice(f"{where}: {_deprecation(moves, kind)}")
    return raw


def _deprecation(moves: dict[str, str | None], kind: Any) -> str:
    """One line naming the old keys and the new ones (`method.moco.{dim,temperature}`), then the ignored ones."""
    groups: dict[tuple, list] = {}
    for key, new in moves.items():
        old_section, name = key.rsplit(".", 1)
        new_section, new_name = new.rsplit(".", 1) if new else (None, None)
        groups.setdefault((old_section, new_section), []).append((name, new_name))
    parts = []
    for (old_section, new_section), names in groups.items():
        was = _braced(old_section, [n for n, _ in names])
        if new_section is None:
            parts.append(f"{was} is not read by method.kind={kind} (ignored)")
        else:
            parts.append(f"{was} is deprecated: write {_braced(new_section, [n for _, n in names])} (read as such)")
    return "; ".join(parts)


def _braced(prefix: str, names: list[str]) -> str:
    return f"{prefix}.{names[0]}" if len(names) == 1 else f"{prefix}.{{{','.join(names)}}}"


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


def _load_chain(path: Path) -> list[tuple[Path, dict]]:
    """The recipe file and its bases, base-most first."""
    chain: list[tuple[Path, dict]] = []
    while path is not None:
        seen = [p for p, _ in chain]
        if path in seen:
            raise ConfigError(f"{path}: circular 'base:' chain: {' -> '.join(str(p) for p in seen + [path])}")
        if len(chain) == MAX_BASE_DEPTH:
            raise ConfigError(
                f"{chain[0][0]}: its 'base:' chain is more than {MAX_BASE_DEPTH} files deep (at {path}); a recipe "
                f"inherits from at most {MAX_BASE_DEPTH} levels of bases: merge some of them"
            )
        raw = _read_yaml(path)
        base = raw.pop(BASE_KEY, None)
        chain.append((path, raw))
        if base is not None and not isinstance(base, str):
            raise ConfigError(f"{path}: 'base' must be a recipe name or path, got {base!r}")
        path = recipe_path(base, relative_to=path.parent) if base is not None else None
    return chain[::-1]


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


SET_IN = "set in "  # a `sources` entry of a value a later recipe file or the command line set without a source


def _leaf_keys(raw: dict, prefix: str = ""):
    for key, value in raw.items():
        if isinstance(value, dict) and value:
            yield from _leaf_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def _line_of(where: str, dotted: str) -> str:
    """`where` with the line that sets `dotted` (`file:line`); `where` itself for the command line."""
    if where == "command line":
        return where
    try:
        node = yaml.compose(Path(where).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return where
    parts = dotted.split(".")
    while parts and isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            head = ".".join(parts[: len(key_node.value.split("."))])
            if key_node.value == head:
                parts = parts[len(head.split(".")) :]
                line, node = key_node.start_mark.line + 1, value_node
                break
        else:
            return where
    return f"{where}:{line}" if not parts else where


def _restate(cfg: DictConfig, raw: dict, where: str, restated: dict[str, str]) -> None:
    """A value this layer (a recipe file, the command line) changes is no longer what an earlier layer's `sources`
    entry states: unless this layer gives its own entry, the value's origin becomes this layer (issue 48, item 8).
    A value set again to what its source states keeps that source."""
    own = set((raw.get("sources") or {}).keys())
    for key in own:
        restated.pop(key, None)
    stated = cfg.get("sources") or {}
    for key in _leaf_keys({k: v for k, v in raw.items() if k != "sources"}):
        if key in stated and key not in own and not _states(stated[key], OmegaConf.select(cfg, key)):
            restated[key] = _line_of(where, key)


def _states(entry, value) -> bool:
    """Whether a `sources` entry [value, source] states `value`."""
    value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    stated = OmegaConf.to_container(entry) if OmegaConf.is_config(entry) else entry
    return isinstance(stated, list) and len(stated) == 2 and stated[0] == value


# The merged files of a recipe's chain, kept from earlier loads: a table's rows share their bases, and merging the
# base-most file into the schema is half of a load (OmegaConf validates every value it merges); copying the kept
# merge costs less. Keyed by each file's path, text and the values it gives (after _old_sections, which depends on
# the chain's method.kind); a prefix of a chain is kept the second time it is merged, so that a process that loads
# one recipe (a rank, `scale train`) pays no copy for it.
MERGES_KEPT = 64
_kept: collections.OrderedDict[str, tuple[bytes, dict[str, str]]] = collections.OrderedDict()  # (_copy, restated)
_seen: set[str] = set()


def _merge_layers(layers: list[tuple[str, dict]], kind: Any, origins: Origins) -> tuple[DictConfig, dict[str, str]]:
    """The schema's defaults with `layers` (the chain's files, base-most first, then the command line) merged in
    order, and the values they restate (_restate); the longest prefix of files merged before is a copy of that merge.
    Notices and errors come in the order of the layers, as each layer merged in turn gives them."""
    cfg, restated, kept, digest = None, {}, None, hashlib.sha256()
    for i, (where, raw) in enumerate(layers):
        raw = _old_sections(raw, kind, where)
        origins.record(raw, where)
        key = None
        if i < len(layers) - 1:  # a file; the command line's layer is not kept
            digest.update(repr((where, Path(where).read_text(encoding="utf-8"), raw)).encode())
            key = digest.hexdigest()
            if cfg is None and key in _kept:
                kept = key
                continue
        if cfg is None:
            cfg, restated = _copy_kept(kept) if kept else (defaults(), {})
        cfg = _merge(cfg, raw, where)
        _restate(cfg, raw, where, restated)
        if key is not None:
            _keep(key, cfg, restated)
    return cfg, restated


def _copy_kept(key: str) -> tuple[DictConfig, dict[str, str]]:
    _kept.move_to_end(key)
    pickled, restated = _kept[key]
    return _copy(pickled), dict(restated)


def _keep(key: str, cfg: DictConfig, restated: dict[str, str]) -> None:
    if key not in _seen:
        if len(_seen) > 100 * MERGES_KEPT:
            _seen.clear()
        _seen.add(key)
        return
    _kept[key] = (pickle.dumps(cfg), dict(restated))
    if len(_kept) > MERGES_KEPT:
        _kept.popitem(last=False)


def load_recipe(name_or_path: str, overrides: Iterable[str] = (), validate: bool = True) -> DictConfig:
    """The resolved, validated recipe as a typed OmegaConf config. `validate=False`: the field rules are not
    checked again (a rank whose launcher loaded and checked the same recipe and overrides, scale.loop.train)."""
    path = recipe_path(name_or_path)
    origins = Origins()
    sources = [(str(file), raw) for file, raw in _load_chain(path)] + [("command line", parse_overrides(overrides))]
    sources = [(where, _renamed(raw, where)) for where, raw in sources]
    kind = _final_kind([raw for _, raw in sources])
    cfg, restated = _merge_layers(sources, kind, origins)
    if not cfg.meta.name:
        cfg.meta.name = recipe_name(path)
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{path}: cannot resolve '{getattr(err, 'full_key', '?')}': {err}") from None
    for key, where in restated.items():
        value = OmegaConf.select(cfg, key)
        value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        cfg.sources[key] = [value, f"{SET_IN}{where}"]
    if validate:
        check_recipe(cfg, Recipe, origins)
    return cfg


def from_dict(data: dict, where: str = "config") -> DictConfig:
    """A recipe from a plain dict (e.g. the config.yaml saved in a run directory, `where`)."""
    data = _renamed(data, where)
    return _merge(defaults(), _old_sections(data, _final_kind([data]), where), where)


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg)


def list_recipes() -> list[Path]:
    """Every recipe file except the bases under recipes/_base."""
    root = recipes_dir()
    return sorted(p for p in root.rglob("*.yaml") if "_base" not in p.relative_to(root).parts)
