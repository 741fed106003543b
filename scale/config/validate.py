"""Check a merged recipe before anything runs: the field rules declared in the schema (scale/config/fields.py),
then the rules that relate several fields. Every failure names where the value came from (a recipe file or the
command line), the dotted key, the value and what is valid."""

import dataclasses
import difflib
import math
import signal
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

import scale.methods.registry as registry  # the methods' declared kinds (no method imported)
from scale.errors import ConfigError

UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)


class Origins:
    """Which source set each dotted key last: a recipe file of the `base:` chain or the command line."""

    def __init__(self) -> None:
        self._source: dict[str, str] = {}

    def record(self, raw: dict, source: str, prefix: str = "") -> None:
        for key, value in raw.items():
            dotted = f"{prefix}{key}"
            self._source[dotted] = source
            if isinstance(value, dict):
                self.record(value, source, dotted + ".")

    def of(self, dotted: str) -> str:
        return self._source.get(dotted, "the schema's default")


def schema_rules(cls: type, prefix: str = "") -> Iterator[tuple[str, dict]]:
    """(dotted key, rule) of every leaf field of dataclass `cls`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        dotted = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            yield from schema_rules(hints[f.name], dotted + ".")
        else:
            yield dotted, dict(f.metadata)


def _fields(cls: type, node: DictConfig) -> Iterator[tuple[str, Any, dict]]:
    """(dotted key, value, rule) of every leaf field of dataclass `cls`, read from `node`."""
    for dotted, rule in schema_rules(cls):
        yield dotted, get_key(node, dotted), rule


def _rule_failure(value: Any, rule: dict) -> str | None:
    """What is wrong with `value` under `rule`, or None."""
    items = value if isinstance(value, typing.Sequence) and not isinstance(value, str) else [value]
    if "choices" in rule:  # for a list: of each element
        choices = rule["choices"]
        for item in items:
            if item not in choices:
                close = difflib.get_close_matches(str(item), [str(c) for c in choices], n=1, cutoff=0.6)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                return f"{'has ' + repr(item) + ', which ' if items is value else ''}is not one of: " + (
                    f"{', '.join(str(c) for c in choices)}{hint}"
                )
    low, high, above, below = rule.get("low"), rule.get("high"), rule.get("above"), rule.get("below")
    for item in items:
        if item is None:
            continue
        if isinstance(item, float) and not math.isfinite(item):
            return "must be a finite number"
        if low is not None and item < low:
            if below is not None:
                return f"must be at least {low} and less than {below}"
            return f"must be at least {low}" if high is None else f"must be between {low} and {high}"
        if high is not None and item > high:
            return f"must be between {low} and {high}"
        if above is not None and not item > above:
            return f"must be greater than {above}"
        if below is not None and not item < below:
            return f"must be less than {below}" if low is None else f"must be at least {low} and less than {below}"
    return None


def _cross_field(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """(dotted key, what is wrong) for each rule relating several fields that `cfg` breaks."""
    views, kind = cfg.data.views, cfg.method.kind
    method = registry.kind(kind)  # self-supervised methods need crops, class heads labels
    if views.kind not in method.views:
        yield "data.views.kind", f"method.kind={kind} trains on views {' or '.join(method.views)}"
    n_global = views.n_global if views.kind == "multicrop" else 2
    if method.global_views is not None and n_global != method.global_views:
        yield "data.views.n_global", f"method.kind={kind} needs {method.global_views} global views, got {n_global}"
    if views.kind in ("multicrop", "two_view"):
        if min(len(views.blur_p), len(views.solarize_p)) < n_global:
            yield "data.views.blur_p", f"blur_p and solarize_p need one entry per global view ({n_global})"
    if views.kind == "multicrop" and len(views.local_sizes) != len(views.n_local):
        yield "data.views.n_local", f"needs one count per entry of data.views.local_sizes {list(views.local_sizes)}"
    if len(cfg.optim.betas) != 2:
        yield "optim.betas", "needs 2 values"
    for name in cfg.train.preempt_signals:
        sig = getattr(signal, str(name), None)
        if not isinstance(sig, signal.Signals):
            yield "train.preempt_signals", f"'{name}' is not a signal name (e.g. SIGTERM, SIGUSR1)"
        elif sig in UNCATCHABLE:
            yield "train.preempt_signals", f"{name} cannot be caught by a process: use e.g. SIGTERM or SIGUSR1"
    if cfg.engine.meta_init and cfg.train.init_weights and cfg.engine.kind != "fsdp2":
        yield "engine.meta_init", "with train.init_weights needs engine.kind=fsdp2"
    if cfg.engine.compile_mode != "default" and cfg.engine.compile_backend != "inductor":
        yield "engine.compile_mode", f"is inductor's: engine.compile_backend={cfg.engine.compile_backend} has no modes"
    if cfg.engine.compile and cfg.engine.kind == "deepspeed" and cfg.engine.zero_stage == 3:
        yield (
            "engine.compile",
            "needs engine.zero_stage 1 or 2 with engine.kind=deepspeed: ZeRO-3 fetches each layer's parameters in "
            "hooks inside the blocks, which torch.compile cannot trace (engine.kind=fsdp2 shards and compiles)",
        )


def check_recipe(cfg: DictConfig, schema: type, origins: Origins) -> None:
    """Raise ConfigError for the first field rule, then the first cross-field rule, that `cfg` breaks."""
    for dotted, value, rule in _fields(schema, cfg):
        failure = _rule_failure(value, rule)
        if failure:
            raise ConfigError(f"{origins.of(dotted)}: {dotted}={_show(value)} {failure}")
    for dotted, failure in _cross_field(cfg):
        raise ConfigError(f"{origins.of(dotted)}: {dotted}={_show(get_key(cfg, dotted))}: {failure}")


def check_launch(cfg: DictConfig, world_size: int, data: bool = True) -> None:
    """Rules that need the launch: the global batch splits evenly over ranks and accumulation steps, the training
    data is there (unless `data` is False: `scale train --synthetic-data`)."""
    per_step = world_size * cfg.engine.grad_accum
    if cfg.train.global_batch % per_step:
        raise ConfigError(
            f"train.global_batch={cfg.train.global_batch} is not divisible by {world_size} ranks x "
            f"engine.grad_accum={cfg.engine.grad_accum} = {per_step}"
        )
    if data and not Path(cfg.data.train).is_dir():
        raise ConfigError(f"data.train={cfg.data.train}: no such directory (set SCALE_DATA or data.train)")


def get_key(cfg: DictConfig, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)
