"""Recipe fields with a rule the loader checks before anything runs. Declare the rule where the field is declared:

    kind: str = choice("fsdp2", ["ddp", "fsdp2", "deepspeed"])  # a closed set: a list, or a function returning one
    mode: str = choice("none", listed_in("scale.engine.activation", "MODES"))  # the list the implementation reads
    workers: int = at_least(4, 0)  # a lower bound; for a list, of each element; None always passes
    flip_p: float = within(0.5, 0.0, 1.0)  # both bounds, inclusive
    eps: float = above(1e-8, 0.0)  # a strict lower bound
    betas: list[float] = below([0.9, 0.999], 0.0, 1.0)  # an inclusive lower and a strict upper bound

Every float, checked or not, must be finite (no .nan or .inf).

Where the implementation keeps a table or tuple of the choices, the schema reads that one (`listed_in`) and the
implementation does not check the value again: the loader has. Adding a choice is adding it to that one list;
adding a checked field is declaring it with one of these.
scale/config/validate.py reads the rules back from the dataclass fields' metadata.
"""

import copy
import importlib
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import Any

Choices = Sequence[Any] | Callable[[], Sequence[Any]]


def _field(default: Any, **rule: Any) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=rule)
    return field(default=default, metadata=rule)


def choice(default: Any, choices: Choices) -> Any:
    """A field whose value must be one of `choices` (a function is called at check time: registries)."""
    return _field(default, choices=choices)


def listed_in(module: str, name: str) -> Callable[[], list]:
    """The choices as the module that implements them lists them (`name`: a tuple, or a dict keyed by choice),
    imported when a recipe is checked: one list, and the schema stays import-light."""
    return lambda: list(getattr(importlib.import_module(module), name))


def at_least(default: Any, low: float) -> Any:
    return _field(default, low=low)


def within(default: Any, low: float, high: float) -> Any:
    return _field(default, low=low, high=high)


def above(default: Any, low: float) -> Any:
    return _field(default, above=low)


def below(default: Any, low: float, high: float) -> Any:
    return _field(default, low=low, below=high)
