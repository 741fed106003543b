"""The method registry, the one list of method kinds. `KINDS` declares each value of `method.kind` with what callers
ask of it: the views it trains on, how many global views it needs, whether it classifies, the kind it extends. Each
kind's settings are the section of `method` named after it (scale/methods/config.py). The recipe schema and its
checks read `KINDS` without importing any method (loading a recipe imports no torch); the class that implements a
kind lives in scale/methods/<kind>.py, declares `kind`, and registers itself when its class is defined
(scale/methods/base.py), taking its attributes from `KINDS`. `method_class(kind)` imports that one module; `methods()`
imports them all (tests/methods/test_registry.py keeps `KINDS` and the classes in step). No torch here.
"""

import functools
import importlib
from dataclasses import dataclass

CROPS = ("multicrop", "two_view")  # data.views.kind of the self-supervised methods: augmented crops
LABELLED = ("supervised", "eval")  # of the methods with a class head: one labelled view


@dataclass(frozen=True)
class Kind:
    views: tuple[str, ...] = CROPS  # the data.views.kind it trains on
    global_views: int | None = None  # the data.views.n_global it needs; None: any
    classifies: bool = False  # the student ends in a class head: the loop validates it on data.val (`val_logits`)
    # the kind whose class this kind's class extends: it reads that kind's section of `method` besides its own
    extends: str | None = None


KINDS = {
    "byol": Kind(global_views=2),
    "dino": Kind(),
    "drloc": Kind(LABELLED, classifies=True, extends="supervised"),
    "esvit": Kind(extends="dino"),
    "mocov2": Kind(global_views=2),
    "mocov3": Kind(global_views=2),
    "simclr": Kind(global_views=2),
    "supervised": Kind(LABELLED, classifies=True),
    "swav": Kind(global_views=2),
}

_REGISTERED: dict[str, type] = {}


def register(cls: type) -> None:
    """Called by Method.__init_subclass__ for each class that declares a `kind`."""
    if cls.kind not in KINDS:
        raise TypeError(
            f"method kind '{cls.kind}' of {cls.__name__} is not declared in scale/methods/registry.py KINDS"
        )
    if cls.kind in _REGISTERED and _REGISTERED[cls.kind] is not cls:
        raise TypeError(
            f"method kind '{cls.kind}' is declared by both {_REGISTERED[cls.kind].__name__} and {cls.__name__}"
        )
    _REGISTERED[cls.kind] = cls


def kinds() -> list[str]:
    """The valid values of `method.kind`."""
    return list(KINDS)


def kind(name: str) -> Kind:
    """What `method.kind=name` declares (a checked recipe's; an unchecked config's unknown kind is a UserError)."""
    from scale.errors import UserError

    if name not in KINDS:
        raise UserError(f"method.kind: unknown method '{name}' (expected one of {', '.join(KINDS)})")
    return KINDS[name]


def method_class(name: str) -> type:
    """The class of `method.kind=name`: only its own module is imported."""
    kind(name)
    importlib.import_module(f"{__package__}.{name}")
    return _REGISTERED[name]


@functools.cache
def methods() -> dict[str, type]:
    """Every method class by kind (imports every method)."""
    return {name: method_class(name) for name in KINDS}
