"""What each recipe key means, read from the schema itself: the comment beside a field (on its lines) and the comment
lines right above it are its description, so that the schema stays the one place a key is described. The type, the
default, the allowed values and the resume rule come from the dataclass field (scale/config/fields.py).
`scale recipes explain KEY` prints one key; tools/gen-docs writes the reference page of every key. Reading the
comments needs the source files only (tokenize), never an import beyond the schema's own."""

import ast
import dataclasses
import functools
import inspect
import io
import tokenize
import typing
from dataclasses import dataclass
from typing import Any

from scale.config.fields import FREE


@dataclass(frozen=True)
class KeyInfo:
    key: str  # dotted, e.g. train.epochs
    description: str
    type: str
    default: Any
    allowed: str  # the choices or bounds in words; "" when any value of the type passes
    resume: str  # free | noted | fixed (scale/config/fields.py)


def describe_all(resolve_choices: bool = True) -> list[KeyInfo]:
    """Every leaf key of the recipe, in schema order. resolve_choices=False leaves choices that a registry lists
    (`listed_in`) as "see <module>.<NAME>" instead of importing that module."""
    from scale.config.schema import Recipe

    return list(_walk(Recipe, "", resolve_choices))


def describe(key: str, resolve_choices: bool = True) -> KeyInfo | None:
    """One dotted key, or None when the schema has no such leaf key."""
    return next((info for info in describe_all(resolve_choices) if info.key == key), None)


def _walk(cls: type, prefix: str, resolve: bool):
    hints = typing.get_type_hints(cls)
    comments = {}  # a field a base dataclass declares is described where it is declared
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            comments.update(_comments(base))
    for f in dataclasses.fields(cls):
        dotted = prefix + f.name
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _walk(hints[f.name], dotted + ".", resolve)
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        yield KeyInfo(
            key=dotted,
            description=comments.get(f.name, ""),
            type=_type_name(hints[f.name]),
            default=default,
            allowed=_allowed(dict(f.metadata), resolve),
            resume=f.metadata.get("resume", FREE),
        )


@functools.cache
def _comments(cls: type) -> dict[str, str]:
    """{field name: its comments} of dataclass `cls`, from its source file."""
    path = inspect.getsourcefile(cls)
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    by_line = {}  # line -> (comment text, whether the line holds nothing else)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            alone = tok.line[: tok.start[1]].strip() == ""
            by_line[tok.start[0]] = (tok.string.lstrip("#").strip(), alone)
    lines = source.splitlines()
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    found = {}
    for stmt in node.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        above = []
        line = stmt.lineno - 1
        while line in by_line and by_line[line][1] and lines[line - 1].strip().startswith("#"):
            above.insert(0, by_line[line][0])
            line -= 1
        beside = [by_line[n][0] for n in range(stmt.lineno, stmt.end_lineno + 1) if n in by_line]
        # a comment above may head a group of fields: "; " sets it off from the comment beside the field
        text = "; ".join(part for part in (" ".join(above), " ".join(beside)) if part)
        if text:
            found[stmt.target.id] = text
    return found


def _type_name(hint: Any) -> str:
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("NoneType", "None")


def _allowed(rule: dict, resolve: bool) -> str:
    parts = []
    if "choices" in rule:
        choices = rule["choices"]
        if callable(choices):
            choices = choices() if resolve else None
        parts.append("one of: " + ", ".join(map(str, choices)) if choices is not None else "a registry's names")
    if "low" in rule:
        parts.append(f">= {rule['low']}")
    if "above" in rule:
        parts.append(f"> {rule['above']}")
    if "high" in rule:
        parts.append(f"<= {rule['high']}")
    if "below" in rule:
        parts.append(f"< {rule['below']}")
    return ", ".join(parts)
