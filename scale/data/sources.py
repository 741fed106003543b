"""List the images of a source data set, in a deterministic order, with their labels (see data_shards/README.md)."""

import csv
import tarfile
from pathlib import Path, PurePosixPath

from PIL import Image

from scale.data.shards.write import Item, Source
from scale.errors import UserError

# every extension PIL opens (any case), except PostScript: opening it runs Ghostscript on the file, i.e. runs a program
IMAGE_EXTENSIONS = frozenset(
    ext for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN and fmt != "EPS"
)
KINDS = ("imagefolder", "imagenet22k", "openimages", "embedded")


def _not_image_reason(relative: str) -> str | None:
    """Why the file at `relative` (a path below the source root, or a tar member) is not used; None if it is."""
    parts = PurePosixPath(relative).parts
    if any(part.startswith(".") for part in parts):
        return "hidden file or folder (name starts with '.'), not used"
    suffix = PurePosixPath(relative).suffix.lower()
    if suffix not in IMAGE_EXTENSIONS:
        return f"not an image: extension '{suffix or '(none)'}' is not one PIL opens, not used"
    return None


def _images_under(folder: Path, root: Path, ignored: list) -> list[Path]:
    """The image files below folder, sorted; every other file goes to `ignored` as (path, reason)."""
    images = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        reason = _not_image_reason(str(path.relative_to(root)))
        if reason:
            ignored.append((str(path), reason))
        else:
            images.append(path)
    return images


def _stray_files(root: Path, reason: str) -> list:
    """Files directly in root, where a source expects only class folders (or synset tars)."""
    return [(str(p), reason) for p in sorted(root.iterdir()) if p.is_file()]


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
    ignored = _stray_files(root, "not inside a class folder, not used")
    ignored += [
        (str(p), "hidden folder (name starts with '.'), not used")
        for p in sorted(root.iterdir())
        if p.is_dir() and p.name.startswith(".")
    ]
    items = [
        Item(str(path), label)
        for label, name in enumerate(classes)
        for path in _images_under(root / name, root, ignored)
    ]
    return Source(f"imagefolder:{root}", "single", classes, items, ignored)


def imagenet22k(root) -> Source:
    """root/SYNSET.tar (the release's per-synset tars) and/or root/SYNSET/ folders; classes = sorted synsets."""
    root = Path(root)
    _require_dir(root, "imagenet22k")
    tars = {p.stem: p for p in root.glob("*.tar")}
    folders = {p.name: p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}
    classes = sorted(set(tars) | set(folders))
    if not classes:
        raise UserError(f"{root}: no SYNSET.tar files or SYNSET/ folders")
    ignored = [
        row
        for row in _stray_files(root, "not a SYNSET.tar or inside a SYNSET/ folder, not used")
        if row[0] not in {str(p) for p in tars.values()}
    ]
    items = []
    for label, synset in enumerate(classes):
        if synset in folders:
            items += [Item(str(p), label) for p in _images_under(folders[synset], root, ignored)]
        if synset in tars:
            try:
                with tarfile.open(tars[synset]) as tar:
                    members = sorted(m.name for m in tar if m.isfile())
            except (tarfile.TarError, OSError) as err:
                raise UserError(f"{tars[synset]}: cannot read the synset tar: {err}") from None
            for name in members:
                reason = _not_image_reason(name)
                if reason:
                    ignored.append((f"{tars[synset]}!{name}", reason))
                else:
                    items.append(Item(f"{tars[synset]}!{name}", label))
    return Source(f"imagenet22k:{root}", "single", classes, items, ignored)


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
    ignored = []
    images = _images_under(root, root, ignored)
    items = [Item(str(p), sorted(index[n] for n in positives.get(p.stem, ()))) for p in images]
    return Source(f"openimages:{root}", "multi", classes, items, ignored)


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
