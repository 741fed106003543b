"""Reading pickles a user hands us (the revisited Oxford/Paris ground truth) without running their code.

`pickle.load` calls whatever callable a file names. This unpickler resolves only builtin containers and scalars and
what numpy needs to rebuild arrays; any other global fails, naming the file and the global."""

import pickle
from pathlib import Path

from scale.errors import UserError

ALLOWED = (
    {
        (module, name)
        for module in ("builtins", "__builtin__")  # the second: Python 2 pickles
        for name in ("dict", "list", "tuple", "set", "frozenset", "int", "float", "complex", "str", "bytes", "bool")
    }
    | {
        (module, name)
        for module in ("numpy.core.multiarray", "numpy._core.multiarray")
        for name in ("_reconstruct", "scalar")
    }
    | {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}
)  # the last: bytes in protocol 2


class RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError(f"refused global {module}.{name}")
        return super().find_class(module, name)


def load(path: str | Path):
    path = Path(path)
    if not path.is_file():
        raise UserError(f"missing {path}")
    try:
        with open(path, "rb") as file:
            value = RestrictedUnpickler(file).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
        raise UserError(
            f"{path}: not a plain-data pickle ({err}); only containers, numbers, strings and numpy arrays are read"
        ) from None
    return value
