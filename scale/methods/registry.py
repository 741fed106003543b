"""The method registry, the one list of method kinds: a Method subclass that declares `kind` registers itself when
its class is defined (scale/methods/base.py), with what callers ask of a kind: the views it trains on, how many
global views it needs, whether it classifies. `methods()` imports every module of this package once, so that each
method has registered; the recipe schema's `method.kind` choices read it. No torch here at module level: the schema
imports this module.
"""

import functools
import importlib
import pkgutil

_REGISTERED: dict[str, type] = {}


def register(cls: type) -> None:
    """Called by Method.__init_subclass__ for each class that declares a `kind`."""
    if cls.kind in _REGISTERED and _REGISTERED[cls.kind] is not cls:
        raise TypeError(
            f"method kind '{cls.kind}' is declared by both {_REGISTERED[cls.kind].__name__} and {cls.__name__}"
        )
    _REGISTERED[cls.kind] = cls


@functools.cache
def methods() -> dict[str, type]:
    """Every registered method class by kind."""
    import scale.methods as package

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")
    return dict(sorted(_REGISTERED.items()))


def kinds() -> list[str]:
    """The valid values of `method.kind`."""
    return list(methods())


def method_class(kind: str) -> type:
    """The class of `method.kind` (a checked recipe's; an unchecked config's unknown kind is a UserError)."""
    from scale.errors import UserError

    if kind not in methods():
        raise UserError(f"method.kind: unknown method '{kind}' (expected one of {', '.join(kinds())})")
    return methods()[kind]
