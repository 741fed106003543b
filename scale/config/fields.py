"""Recipe fields with a rule the loader checks before anything runs. Declare the rule where the field is declared:

    kind: str = choice("fsdp2", ["ddp", "fsdp2", "deepspeed"])  # a closed set
    mode: str = choice("epochs", listed_in("scale.data.loader", "MODES", ("epochs", "resampled")))  # as implemented
    workers: int = at_least(4, 0)  # a lower bound; for a list, of each element; None always passes
    flip_p: float = within(0.5, 0.0, 1.0)  # both bounds, inclusive
    img_size: int = at_least(224, 1, resume=FIXED)  # a resumed run must keep it (it shapes a tensor)
    final_norm: bool = plain(True, resume=FIXED)  # a field with no other rule
    eps: float = above(1e-8, 0.0)  # a strict lower bound
    betas: list[float] = below([0.9, 0.999], 0.0, 1.0)  # an inclusive lower and a strict upper bound

On resume (scale/checkpoint/resume.py), a FIXED field that differs from the run's saved config.yaml is refused (exit 2): it
changes a checkpointed tensor's shape, the set of trained parameters, or what the saved state means. A NOTED field
may change; the resumed run logs the change. Every other field changes freely (budgets, logging, paths of outputs).
tests/checkpoint/test_fixed_fields.py fails when a field that shapes a checkpointed tensor is not FIXED.

Every float, checked or not, must be finite (no .nan or .inf).

Where the implementation keeps a table or tuple of the choices, the schema declares the same values beside the field
(`listed_in`: the values, and where the implementation lists them) and the implementation does not check the value
again: the loader has. The schema never imports the implementation (loading, checking and showing a recipe import no
torch: tests/test_cli_light.py); tests/config/test_choices.py fails when the two lists differ. Adding a
choice is adding it to both; adding a checked field is declaring it with one of these.
scale/config/validate.py reads the rules back from the dataclass fields' metadata.
"""

import copy
from collections.abc import Sequence
from dataclasses import field
from typing import Any

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


def choice(default: Any, choices: Sequence[Any], resume: str = FREE) -> Any:
    """A field whose value must be one of `choices`."""
    return _field(default, resume, choices=choices)


class Listed(tuple):
    """Choices that an implementation module also lists: `source` is (module, name) of its tuple, or of its dict
    keyed by choice, which tests/config/test_choices.py compares with these values (the loader never imports it)."""

    source: tuple[str, str]


def listed_in(module: str, name: str, choices: Sequence[Any]) -> Listed:
    """`choices`, declared as `module.name` lists them (same values, same order)."""
    listed = Listed(choices)
    listed.source = (module, name)
    return listed


def at_least(default: Any, low: float, resume: str = FREE) -> Any:
    return _field(default, resume, low=low)


def within(default: Any, low: float, high: float, resume: str = FREE) -> Any:
    return _field(default, resume, low=low, high=high)


def above(default: Any, low: float, resume: str = FREE) -> Any:
    return _field(default, resume, above=low)


def below(default: Any, low: float, high: float, resume: str = FREE) -> Any:
    return _field(default, resume, low=low, below=high)
