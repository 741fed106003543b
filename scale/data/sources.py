"""List the images of a source data set, in a deterministic order, with their labels (see data_shards/README.md)."""

import csv
import tarfile
from pathlib import Path

from scale.data.shards import Item, Source
from scale.errors import UserError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".jfif")
KINDS = ("imagefolder", "imagenet22k", "openimages", "embedded")


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not Path(name).name.startswith(".")


def _images_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and _is_image(p.name))


def _require_dir(path: Path, kind: str) -> None:
    if not path.is_dir():
        raise UserError(f"{kind} source not found or not a directory: {path}")


def imagefolder(root) -> Source:
    """root/CLASS/**/IMAGE (torchvision ImageFolder layout); classes are the sorted sub-folder names."""
    root = Path(root)
    _require_dir(root, "imagefolder")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise UserError(f"{root}: no class sub-folders (imagefolder expects ROOT/CLASS/IMAGE)")
    items = [Item(str(path), label) for label, name in enumerate(classes) for path in _images_under(root / name)]
    return Source(f"imagefolder:{root}", "single", classes, items)


def imagenet22k(root) -> Source:
    """root/SYNSET.tar (the release's per-synset tars) and/or root/SYNSET/ folders; classes = sorted synsets."""
    root = Path(root)
    _require_dir(root, "imagenet22k")
    tars = {p.stem: p for p in root.glob("*.tar")}
    folders = {p.name: p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}
    classes = sorted(set(tars) | set(folders))
    if not classes:
        raise UserError(f"{root}: no SYNSET.tar files or SYNSET/ folders")
    items = []
    for label, synset in enumerate(classes):
        if synset in folders:
            items += [Item(str(p), label) for p in _images_under(folders[synset])]
        if synset in tars:
            try:
                with tarfile.open(tars[synset]) as tar:
                    names = sorted(m.name for m in tar if m.isfile() and _is_image(m.name))
            except (tarfile.TarError, OSError) as err:
                raise UserError(f"{tars[synset]}: cannot read the synset tar: {err}") from None
            items += [Item(f"{tars[synset]}!{name}", label) for name in names]
    return Source(f"imagenet22k:{root}", "single", classes, items)


def openimages(root, labels_csv: str | None) -> Source:
    """root/**/IMAGEID.jpg with an image-level label CSV (ImageID, Source, LabelName, Confidence).

    Multi-label: each image keeps the sorted list of its positive labels (Confidence 1); images without a row keep
    an empty list. Classes are the sorted LabelName values (e.g. /m/01g317).
    """
    root = Path(root)
    _require_dir(root, "openimages")
    if not labels_csv or not Path(labels_csv).is_file():
        raise UserError(f"openimages needs --labels CSV (image-level labels); not found: {labels_csv}")
    positives: dict = {}
    with open(labels_csv, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"ImageID", "LabelName"} - set(reader.fieldnames or [])
        if missing:
            raise UserError(f"{labels_csv}: missing columns {sorted(missing)}")
        for row in reader:
            if float(row.get("Confidence") or 1) >= 1:
                positives.setdefault(row["ImageID"], set()).add(row["LabelName"])
    classes = sorted({name for names in positives.values() for name in names})
    index = {name: i for i, name in enumerate(classes)}
    items = [Item(str(p), sorted(index[n] for n in positives.get(p.stem, ()))) for p in _images_under(root)]
    return Source(f"openimages:{root}", "multi", classes, items)


def parse_source(spec: str) -> tuple[str, str]:
    kind, sep, path = spec.partition(":")
    if not sep or kind not in KINDS or not path:
        raise UserError(f"--source must be KIND:PATH with KIND in {', '.join(KINDS)}, got '{spec}'")
    return kind, path


def open_source(kind: str, path: str, labels_csv: str | None = None) -> Source:
    if kind == "imagefolder":
        return imagefolder(path)
    if kind == "imagenet22k":
        return imagenet22k(path)
    if kind == "openimages":
        return openimages(path, labels_csv)
    raise UserError(f"unknown source kind '{kind}'")
