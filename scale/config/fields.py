"""Recipe fields with a rule the loader checks before anything runs. Declare the rule where the field is declared:

    kind: str = choice("fsdp2", ["ddp", "fsdp2", "deepspeed"])  # a closed set: a list, or a function returning one
    mode: str = choice("none", listed_in("scale.engine.activation", "MODES"))  # the list the implementation reads
    workers: int = at_least(4, 0)  # a lower bound; for a list, of each element; None always passes
    flip_p: float = within(0.5, 0.0, 1.0)  # both bounds, inclusive
    img_size: int = at_least(224, 1, resume=FIXED)  # a resumed run must keep it (it shapes a tensor)
    final_norm: bool = plain(True, resume=FIXED)  # a field with no other rule
    eps: float = above(1e-8, 0.0)  # a strict lower bound
    betas: list[float] = below([0.9, 0.999], 0.0, 1.0)  # an inclusive lower and a strict upper bound

On resume (scale/loop/resume.py), a FIXED field that differs from the run's saved config.yaml is refused (exit 2): it
changes a checkpointed tensor's shape, the set of trained parameters, or what the saved state means. A NOTED field
may change; the resumed run logs the change. Every other field changes freely (budgets, logging, paths of outputs).
tests/checkpoint/test_fixed_fields.py fails when a field that shapes a checkpointed tensor is not FIXED.

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

# what a field may do between a run and its resumed continuation (the `resume` rule)
FREE, NOTED, FIXED = "free", "noted", "fixed"


def _field(default: Any, resume: str = FREE, **rule: Any) -> Any:
    if resume not in (FREE, NOTED, FIXED):
        raise ValueError(f"resume must be FREE, NOTED or FIXED, got {resume!r}")
    if resume != FREE:
        rule["resume"] = resume
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=rule)
    return field(default=default, metadata=rule)


def plain(default: Any, resume: str) -> Any:
    """A field without a value rule that declares how it behaves on resume."""
    return _field(default, resume)


def choice(default: Any, choices: Choices, resume: str = FREE) -> Any:
    """A field whose value must be one of `choices` (a function is called at check time: registries)."""
    return _field(default, resume, choices=choices)


def listed_in(module: str, name: str) -> Callable[[], list]:
    """The choices as the module that implements them lists them (`name`: a tuple, or a dict keyed by choice),
    imported when a recipe is checked: one list, and the schema stays import-light."""
    return lambda: list(getattr(importlib.import_module(module), name))


def at_least(default: Any, low: float, resume: str = FREE) -> Any:
    return _field(default, resume, low=low)


def within(default: Any, low: float, high: float, resume: str = FREE) -> Any:
    return _field(default, resume, low=low, high=high)


def above(default: Any, low: float, resume: str = FREE) -> Any:
    return _field(default, resume, above=low)


def below(default: Any, low: float, high: float, resume: str = FREE) -> Any:
    return _field(default, resume, low=low, below=high)
