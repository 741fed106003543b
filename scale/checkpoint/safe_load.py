"""A checkpoint is data, never code: every file a checkpoint holds is read without running what it names.

- torch files (our RNG, monitors and run state; DeepSpeed's model, optimizer and teacher states) load with
  `torch.load(weights_only=True)`, DeepSpeed's few own types allow-listed;
- DCP's `.metadata` (a plain pickle that torch unpickles unrestricted) goes through an unpickler that knows only
  DCP's metadata classes, and DCP's non-tensor items (pickled by torch.save) load with weights_only.

`check_files` reads a checkpoint's files this way before anything else does (DeepSpeed loads its files with
weights_only=False): every file on disk, whatever meta.json lists (DeepSpeed opens the files it finds, and a
`universal/` folder beside them), then the checksums recorded at seal time. A file that would run code raises
UnsafeCheckpoint (exit 2); a damaged or changed one is reported. A symbolic link anywhere in a step directory is
refused the same way: a walk that checks files does not enter linked folders, yet DeepSpeed's loads and its universal
conversion open whatever a link points to (an `engine/universal` link skips the conversion and loads the folder it
names), and scale never writes a link there.
"""

import io
import os
import pickle
import re
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta

from scale.checkpoint.checksum import mismatch
from scale.errors import UserError
from scale.readback import CHECKPOINT_META, BadFile, read_json


class UnsafeCheckpoint(UserError):
    """A checkpoint file names code to run (a crafted pickle): refused, never skipped."""


class DamagedFile(Exception):
    """A checkpoint file that cannot be read (truncated, overwritten): the checkpoint is skipped."""


_DCP = "torch.distributed.checkpoint.metadata"
METADATA_GLOBALS = {
    *(
        (_DCP, name)
        for name in (
            "Metadata",
            "TensorStorageMetadata",
            "TensorProperties",
            "ChunkStorageMetadata",
            "BytesStorageMetadata",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        )
    ),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


def _deepspeed_globals() -> list:
    """The types DeepSpeed pickles into its checkpoint files besides tensors and containers."""
    from scale.engine.deepspeed import choose_accelerator

    choose_accelerator()  # before DeepSpeed's first import: no accelerator warning in `scale ckpt info`
    try:
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError:
        return []
    return [ZeroStageEnum, LossScaler, fragment_address]


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        if (module, name) in METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpoint(f"{self.path}: refused to load: it names {module}.{name}, which is not checkpoint data")


def read_dcp_metadata(path: Path) -> Metadata:
    """DCP's `.metadata` through the restricted unpickler; DamagedFile when it is not a metadata pickle."""
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f, path).load()
    except UnsafeCheckpoint:
        raise
    except Exception as err:  # garbage gives any of pickle's, EOF's, attribute or type errors
        raise DamagedFile(f"{path}: unreadable DCP metadata ({type(err).__name__}: {err})") from None
    if not isinstance(metadata, Metadata):
        raise DamagedFile(f"{path}: not DCP metadata (a {type(metadata).__name__})")
    return metadata


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
_TORCH_REASON = re.compile(r"WeightsUnpickler error: ([^\n]*?)(?: Please use|$)", re.M)


def refusal(path, err: Exception) -> str:
    """Why a pickle a user handed us was not loaded, in scale's words: the file, the first thing it names that is
    not data, and a safe way on. Never torch's own text, which advises loading it with weights_only=False: the one
    thing not to do with a file from elsewhere."""
    named = _GLOBAL.search(str(err))
    what = (
        f"it names {named.group(1)}, code that loading it would run" if named else "it holds objects that are not data"
    )
    return (
        f"{path}: refused to load: {what}; nothing was run. Where you trust the file, re-save its tensors as "
        "safetensors (safetensors.torch.save_file) or as a plain state dict (torch.save(model.state_dict(), ...)) "
        "and use that file"
    )


def torch_reason(err: Exception) -> str:
    """The reason in a torch.load error, without torch's advice to retry with weights_only=False."""
    text = str(err)
    found = _TORCH_REASON.search(text)
    if found:
        return found.group(1).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    kept = [line for line in lines if "weights_only" not in line and not line.startswith("Weights only load failed")]
    return (kept or [type(err).__name__])[0][:200]


def why_not_loaded(path, err: Exception, what: str) -> str:
    """One line for a torch.load of a user's file that failed: the refusal of a pickle that names code, else
    `what` it is not, with torch's reason."""
    cause = err
    while cause is not None and not isinstance(cause, pickle.UnpicklingError):  # timm wraps torch's in its own
        cause = cause.__cause__ or cause.__context__
    if cause is not None and _GLOBAL.search(str(cause)):
        return refusal(path, cause)
    return f"{path}: {what} ({type(err).__name__}: {torch_reason(err)})"


def load_torch(path: Path | io.BytesIO, name: str | Path | None = None, map_location="cpu", mmap: bool = False):
    """torch.load with weights_only (DeepSpeed's types allowed where a file names them): UnsafeCheckpoint when
    the file names other code, DamagedFile when it is not a torch file. `mmap` (a file path): the tensors map the
    file instead of being read, so reading only their shapes reads only the pickle and the zip directory."""
    name = name or path
    kw = {"map_location": map_location, "weights_only": True, "mmap": mmap}
    try:
        try:
            return torch.load(path, **kw)
        except pickle.UnpicklingError as err:
            if "deepspeed." not in str(err):
                raise
            if isinstance(path, io.BytesIO):
                path.seek(0)
            with torch.serialization.safe_globals(_deepspeed_globals()):  # imports DeepSpeed only when named
                return torch.load(path, **kw)
    except pickle.UnpicklingError as err:
        if "GLOBAL" in str(err):  # a named function or class that is not allowed, e.g. os.system
            raise UnsafeCheckpoint(refusal(name, err)) from None
        raise DamagedFile(f"{name}: unreadable ({torch_reason(err)})") from None
    except Exception as err:
        raise DamagedFile(f"{name}: unreadable ({type(err).__name__}: {torch_reason(err)})") from None


class SafeReader(FileSystemReader):
    """FileSystemReader whose metadata goes through the restricted unpickler."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        metadata = read_dcp_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner whose non-tensor items load with weights_only (torch's own uses weights_only=False)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        item = load_torch(value, read_item.dest_index.fqn)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], item)
        else:
            self.state_dict[read_item.dest_index.fqn] = item


def _check_dcp_bytes(folder: Path, data_file: str) -> None:
    """The non-tensor items stored in one `.distcp` file, loaded as data."""
    try:
        metadata = read_dcp_metadata(folder / ".metadata")
    except (UnsafeCheckpoint, DamagedFile):
        return  # the rank that checks `.metadata` reports it, once
    for index, info in (metadata.storage_data or {}).items():
        if info.relative_path != data_file:
            continue
        if not isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            continue
        with open(folder / data_file, "rb") as f:
            f.seek(info.offset)
            raw = f.read(info.length)
        load_torch(io.BytesIO(raw), f"{folder / data_file} (item '{index.fqn}')")


# files of DeepSpeed's folder that it reads as text or never opens; it may unpickle any other
ENGINE_TEXT = ("latest", "latest_universal")
ENGINE_SUFFIXES_NOT_LOADED = (".json", ".py")
PARTIAL_CONVERSION = "engine/universal.partial/"  # a killed conversion's leftovers: deleted before the next one


def check_file(folder: Path, name: str) -> None:
    """Read one file of a step directory as data; raises UnsafeCheckpoint or DamagedFile."""
    path = folder / name
    in_engine = Path(name).parts[0] == "engine"
    if path.name == ".metadata":
        read_dcp_metadata(path)
    elif path.suffix == ".distcp":
        _check_dcp_bytes(path.parent, path.name)
    elif path.suffix == ".pt" or (
        in_engine and path.name not in ENGINE_TEXT and path.suffix not in ENGINE_SUFFIXES_NOT_LOADED
    ):
        load_torch(path)


def first_link(folder: Path) -> Path | None:
    """The first symbolic link (to a file or a folder, absolute or relative) in `folder`, or None; the walk never
    enters a linked folder, so every link is seen before anything reads through it."""
    for parent, dirs, files in os.walk(folder):  # followlinks=False: a linked folder is listed, never entered
        for name in sorted(dirs + files):
            if (Path(parent) / name).is_symlink():
                return Path(parent) / name
    return None


def refused_link(link: Path) -> UnsafeCheckpoint:
    return UnsafeCheckpoint(
        f"{link}: refused to load: a symbolic link (to {os.readlink(link)}) inside a checkpoint, which scale never "
        "writes; a loader would read what it points to unchecked. Replace it by the files themselves, or remove "
        "the checkpoint"
    )


def files_on_disk(folder: Path) -> list[str]:
    names = (str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != "meta.json")
    return [name for name in names if not name.startswith(PARTIAL_CONVERSION)]


def check_files(folder: Path, rank: int = 0, world_size: int = 1, verify: bool = True) -> str | None:
    """This rank's share of a step directory's files (every world_size-th, so each file is read by one rank), read
    as data, then (`verify`) checked against their checksums. Every file there counts, listed in meta.json or not
    (but for what a killed universal conversion left, which is never read). Returns why the checkpoint cannot be
    loaded, or None; raises UnsafeCheckpoint."""
    link = first_link(folder)
    if link is not None:  # every rank finds it, none reads through it; rank 0 says it, once
        if rank == 0:
            raise refused_link(link)
        return f"{link}: a symbolic link"
    try:
        meta = read_json(folder / "meta.json", CHECKPOINT_META)
    except (OSError, BadFile) as err:
        return f"meta.json unreadable ({err})"
    listed = meta["files"]
    mine = sorted(set(listed) | set(files_on_disk(folder)))[rank::world_size]
    for name in mine:
        try:
            check_file(folder, name)
        except DamagedFile as err:
            return str(err)
    return mismatch(folder, meta, [name for name in mine if name in listed]) if verify else None
