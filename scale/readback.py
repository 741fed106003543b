"""Every file scale writes and later reads back, read through one reader per format that checks it against the
file's schema (all in this module): a file of the wrong shape (a JSON list where an object was written, a string
where a number was, truncated text, bytes that are not UTF-8) is one BadFile naming the file and the field, never
an AttributeError or KeyError far from the read.

What a caller does with a BadFile: in a checkpoint (meta.json) it is a damaged checkpoint (skipped with a warning,
the previous one used, the damaged one set aside by the resume); elsewhere a UserError (exit 2, one line), or an
empty field where a reader is defensive by design (`scale status`).

A schema is a type, a tuple of types, a dict {key: schema} (an object with these keys; more keys are allowed, so
that older readers accept newer files), Optional(schema) for a key that may be absent, ListOf(schema),
MapOf(schema) (an object whose keys are any names) or Pair(a, b). Torch-free, imported by every layer.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scale.errors import UserError


class BadFile(UserError):
    """A file scale wrote that does not read back as it was written: `path`, the `field` (e.g. `files["a.pt"]`,
    '' for the whole file) and what is wrong."""

    def __init__(self, path: str | Path, field: str, problem: str):
        self.path, self.field, self.problem = Path(path), field, problem
        self.detail = f"{field}: {problem}" if field else problem  # without the path
        super().__init__(f"{path}: {self.detail}")


@dataclass(frozen=True)
class Optional:
    schema: Any  # a key that may be absent (older files lack it); when present it must match


@dataclass(frozen=True)
class ListOf:
    item: Any  # a JSON array / YAML sequence, every item matching


@dataclass(frozen=True)
class MapOf:
    value: Any  # an object whose keys are names (str), every value matching


@dataclass(frozen=True)
class Pair:
    first: Any  # a two-item array [first, second]
    second: Any


class Integer:
    """An int that is no bool (JSON's true is Python's 1)."""


class Number:
    """An int or float that is no bool."""


NONE = type(None)
NAMES = {dict: "an object", list: "a list", str: "a string", bool: "true or false", NONE: "null"}
NAMES.update({int: "an integer", float: "a number", Integer: "an integer", Number: "a number"})


def kind(value) -> str:
    """The JSON/YAML name of a value's type, for messages: 'a list', 'a string' ..."""
    return NAMES.get(type(value), f"a {type(value).__name__}")


def _is(value, expected) -> bool:
    if expected is Integer:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is Number:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, expected) and not (expected is int and isinstance(value, bool))


def _sub(field: str, key) -> str:
    return f"{field}[{key!r}]" if not isinstance(key, str) or not key.isidentifier() else f"{field}.{key}".lstrip(".")


def check(value, schema, path: str | Path, field: str = "") -> None:
    """Raise BadFile (naming `path` and the field) where `value` does not match `schema`."""
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise BadFile(path, field, f"{kind(value)}, not an object")
        for key, sub in schema.items():
            optional = isinstance(sub, Optional)
            if key not in value:
                if optional:
                    continue
                raise BadFile(path, _sub(field, key), "missing")
            check(value[key], sub.schema if optional else sub, path, _sub(field, key))
    elif isinstance(schema, ListOf):
        if not isinstance(value, list):
            raise BadFile(path, field, f"{kind(value)}, not a list")
        for index, item in enumerate(value):
            check(item, schema.item, path, f"{field}[{index}]")
    elif isinstance(schema, MapOf):
        if not isinstance(value, dict):
            raise BadFile(path, field, f"{kind(value)}, not an object")
        for key, item in value.items():
            if not isinstance(key, str):
                raise BadFile(path, _sub(field, key), f"a key that is {kind(key)}, not a name")
            check(item, schema.value, path, _sub(field, key))
    elif isinstance(schema, Pair):
        if not isinstance(value, list) or len(value) != 2:
            raise BadFile(path, field, f"{kind(value)}, not a pair [a, b]")
        check(value[0], schema.first, path, f"{field}[0]")
        check(value[1], schema.second, path, f"{field}[1]")
    elif schema is not Any:
        options = schema if isinstance(schema, tuple) else (schema,)
        if not any(_is(value, option) for option in options):
            wanted = " or ".join(NAMES.get(option, option.__name__) for option in options)
            raise BadFile(path, field, f"{kind(value)}, not {wanted}")


def _decoded(data: bytes, path: str | Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadFile(path, "", f"not UTF-8 text (byte {err.start})") from None


def _text(path: str | Path) -> str:
    """The file's text; BadFile for bytes that are not UTF-8. OSError (a missing file) is the caller's."""
    return _decoded(Path(path).read_bytes(), path)


def parse_json(text: str, path: str | Path, schema):
    try:
        value = json.loads(text)
    except ValueError as err:  # truncated or not JSON at all
        raise BadFile(path, "", f"not valid JSON ({err})") from None
    check(value, schema, path)
    return value


def read_json(path: str | Path, schema):
    """A JSON file matching `schema` (an object, in every file scale writes)."""
    return parse_json(_text(path), path, schema)


def read_json_lines(path: str | Path, schema, torn_tail: bool = False, skip: bool = False) -> list:
    """A JSON-lines file, each line matching `schema`. `torn_tail`: a last line that does not (a write killed
    half-way) is dropped rather than refused; `skip`: every such line is (a reader that shows what it can)."""
    lines = [(n, line) for n, line in enumerate(Path(path).read_bytes().splitlines(), 1) if line.strip()]
    records = []
    for number, line in lines:
        try:
            records.append(parse_json(_decoded(line, path), path, schema))
        except BadFile as err:
            if not (skip or torn_tail and number == lines[-1][0]):
                raise BadFile(path, f"line {number}" + (f": {err.field}" if err.field else ""), err.problem) from None
    return records


def read_metrics(path: str | Path, skip: bool = False) -> list[dict]:
    """<run>/metrics.jsonl's records; none before the run wrote one. Its last line may be torn (a kill, or the run
    writing it): dropped. `skip`, for readers that show what they can (`scale status`, the trackers' replay): any
    line that does not read is skipped, and a file that cannot be read is no record."""
    try:
        return read_json_lines(path, METRICS_LINE, torn_tail=True, skip=skip)
    except FileNotFoundError:
        return []
    except OSError:
        if skip:
            return []
        raise


def read_yaml(path: str | Path, schema):
    """A YAML file (aliases bounded as for recipes), matching `schema`; an empty file is an empty mapping."""
    import yaml

    from scale.config.load import parse_yaml

    try:
        value = parse_yaml(_text(path), Path(path))
    except yaml.YAMLError as err:
        problem = str(getattr(err, "problem", None) or err).splitlines()[0]
        raise BadFile(path, "", f"not valid YAML ({problem})") from None
    value = {} if value is None else value
    check(value, schema, path)
    return value


def read_line(path: str | Path, pattern: str) -> str:
    """A one-line text file whose line (stripped) matches the regular expression `pattern`."""
    line = _text(path).strip()
    if not re.fullmatch(pattern, line):
        raise BadFile(path, "", f"{line[:60]!r} is not {pattern!r}")
    return line


# --- the schemas, one per file ---

# checkpoints/step_N/meta.json (scale.checkpoint.store): sealed last, read by the resume, `scale ckpt info|export`
CHECKPOINT_META = {
    "step": Integer,
    "engine": str,
    "world_size": Integer,
    "complete": bool,
    "files": MapOf(Integer),  # file -> size in bytes
    "checksums": Optional({"algorithm": str, "files": MapOf(str)}),  # absent before checksums were recorded
    "saved_at": Optional(Number),
    "epoch": Optional((Number, NONE)),
    "recipe": Optional((str, NONE)),
    "samples_seen": Optional((Integer, NONE)),
}
# checkpoints/step_N/data_counters/rankN.json (scale.checkpoint.checkpointer): one rank's loader counters
DATA_COUNTERS = {
    "samples": Optional(Integer),
    "epoch_errors": Optional(Integer),
    "errors": Optional(MapOf(Integer)),
}
# checkpoints/latest: the newest step directory's name
LATEST = r"step_\d+"
# checkpoints/saves.jsonl, one line per sealed checkpoint (scale.checkpoint.checkpointer, read by diskspace)
SAVES_LINE = {"step": Integer, "bytes": Integer, "save_s": Optional(Number), "stall_s": Optional(Number)}
# <run>/metrics.jsonl (scale.trackers.jsonl): one line per log step
METRICS_LINE = {"step": Number, "time": Optional(Number), "epoch": Optional(Number)}
# <run>/eval/<name>.json (scale.eval): one evaluation's results, each protocol its own keys
EVAL_RESULT = MapOf(Any)
# <run>/eval/val.json (scale.loop.validation): the last validation, and every one before it
VAL_RESULT = {"val": Any, "history": ListOf({"step": Integer})}
# <run>/slurm.json (scale.launch.slurm): the last job submitted for the run
JOB = {"job_id": (str, Integer)}
# checkpoints/steering.json (scale.checkpoint.resume): the train.resume_step / train.reset applied
STEERING = {
    "applied": {"resume_step": (Integer, NONE), "reset": ListOf(str)},
    "at": Optional(str),
    "loaded_step": Optional(Integer),
    "set_aside": Optional((str, NONE)),
}
# <run>/trackers.json (scale.trackers): each tracker's run id, the last step the trackers received and the step
# the current tracker runs began from (a rollback's; absent in older files: 0)
TRACKERS = {"ids": MapOf(str), "last_step": Integer, "since": Optional(Integer)}
# <run>/heartbeat.json (scale.watch.heartbeat): rank 0's step and phase, rewritten every few seconds
HEARTBEAT = {
    "step": Integer,
    "phase": str,
    "phase_since": Number,
    "time": Number,
    "step_since": Optional(Number),
    "last_log": Optional((Number, NONE)),
}
# <shards>/_info.json (scale.data.shards): the manifest
SHARD_MANIFEST = {
    "label_kind": str,
    "classes": ListOf(Any),
    # each shard's count is checked where its message can say how to fix it (scale.data.shards.read)
    "shards": ListOf({"name": str, "count": Any, "index": Optional(str)}),
    "num_samples": Optional(Integer),
}
# <shards>/shard-N.idx: each member's key and, per extension, its [offset, size] in the tar
SHARD_INDEX = {"members": ListOf(Pair(Any, MapOf(Pair(Integer, Integer))))}
# the same file as `scale shards build` reads it back to reuse a shard built before: all it recorded
SHARD_BUILT = {**SHARD_INDEX, "name": str, "count": Integer, "sha256": str, "bytes": Integer, "digest": str}
SHARD_BUILT["skipped"] = ListOf(Pair(str, str))  # the items left out, and why
# <run>/config.yaml: the run's resolved recipe, a mapping of sections (each checked by scale.config when loaded)
SECTIONS = ("meta", "data", "model", "method", "optim", "engine", "train", "eval", "sources")
RUN_CONFIG = {section: Optional(dict) for section in SECTIONS}
# the same file where the model is built from it (`scale ckpt export --format timm|hf`): it names the model
RUN_CONFIG_WITH_MODEL = {**RUN_CONFIG, "model": {"name": str}}
