"""`build_loader`: the recipe's data.backend picks the loader (scale/data/loader.py, or scale/data/dali for the
crop views under DALI). Kept apart from both, so that neither imports the other's importer."""

from scale.data.loader import Loader
from scale.data.spec import LoaderSpec
from scale.errors import UserError

BACKENDS = ("torchvision", "dali")  # data.backend


def build_loader(spec: LoaderSpec) -> Loader:
    """A loader over spec.data.train or spec.data.val (scale/data/loader.py's docstring says what it guarantees);
    with data.backend=dali, the crop views (multicrop, two_view) come from scale.data.dali, the others from Loader."""
    if spec.data.backend == "dali" and spec.views.kind in ("multicrop", "two_view"):
        if spec.data.repeated_aug > 1:
            raise UserError("data.repeated_aug needs data.backend=torchvision (DALI's reader keeps its own order)")
        from scale.data.dali import build_dali_loader

        return build_dali_loader(spec)
    return Loader(spec)
