"""Read a checkpoint offline (no process group, any world size): what it holds, and a consolidated backbone
state dict for evaluation, fine-tuning or timm (`strict=True`), or the whole student net."""

import hashlib
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from scale.checkpoint.safe_load import DamagedFile, SafeLoadPlanner, SafeReader, check_files
from scale.checkpoint.store import META, TMP_PREFIX, CheckpointStore, checkpoints_root, resolve
from scale.errors import UserError, os_error
from scale.readback import RUN_CONFIG_WITH_MODEL, read_yaml

# "student": the whole student net (backbone and heads, e.g. a fine-tuned classifier)
WHAT = {
    "teacher-backbone": "engine.teacher.backbone.",
    "student-backbone": "engine.student.backbone.",
    "student": "engine.student.",
}


def _reader(folder: Path) -> SafeReader:
    if not (folder / "dcp").is_dir():
        raise UserError(
            f"{folder}: no DCP state (a DeepSpeed checkpoint? export it with engine.kind=deepspeed "
            f"tools: deepspeed.utils.zero_to_fp32)"
        )
    return SafeReader(str(folder / "dcp"))


def tensor_keys(folder: Path) -> dict[str, TensorStorageMetadata]:
    try:
        meta = _reader(folder).read_metadata()
    except DamagedFile as err:
        raise UserError(str(err)) from None
    return {k: v for k, v in meta.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}


def read_tensors(folder: Path, prefix: str) -> dict[str, torch.Tensor]:
    """Every tensor whose flattened key starts with `prefix`, consolidated in full, keys without the prefix."""
    keys = {k: v for k, v in tensor_keys(folder).items() if k.startswith(prefix)}
    if not keys:
        raise UserError(f"{folder}: no tensors under '{prefix.rstrip('.')}' (does this method have it?)")
    template = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in keys.items()}
    with warnings.catch_warnings():  # DCP warns that no process group exists: reading offline is the point
        warnings.simplefilter("ignore", UserWarning)
        try:
            dcp.load(template, storage_reader=_reader(folder), planner=SafeLoadPlanner(), no_dist=True)
        except CheckpointException as err:  # not an Exception subclass
            raise UserError(f"{folder}: cannot read its tensors ({err})") from None
    return {k[len(prefix) :]: t for k, t in sorted(template.items())}


def checksum(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for key, tensor in sorted(tensors.items()):
        digest.update(key.encode())
        digest.update(tensor.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def checked(path: str | Path, verify: bool = True) -> Path:
    """The step directory `path` resolves to, once every file in it has been read as data and (`verify`) matched
    with its checksum (exit 2 otherwise)."""
    folder = resolve(path)
    problem = check_files(folder, verify=verify)
    if problem:
        raise UserError(f"{folder}: damaged checkpoint: {problem}")
    return folder


def newest_readable(path: Path, verify: bool) -> tuple[Path | None, dict[str, str]]:
    """The step directory `path` names, or else its run's newest one whose files all read as data (and match
    their checksums: `verify`), or None; and why each newer one was passed over, by folder name."""
    if (path / META).is_file():
        return checked(path, verify), {}
    if path.name.startswith(("step_", TMP_PREFIX)):  # a step directory that is not sealed: the listing says why
        return None, {}
    passed = {}
    for folder in CheckpointStore(checkpoints_root(path)).candidates():
        problem = check_files(folder, verify=verify)
        if not problem:
            return folder, passed
        passed[folder.name] = f"damaged: {problem}"
    return None, passed


def info(path: str | Path, verify: bool = False) -> dict:
    """What the newest loadable checkpoint holds (`path` a run, its checkpoints/ folder or a step directory), and
    every checkpoint of the run; a run without a loadable one lists what it has. `verify`: also match every file
    with the checksum recorded when it was saved (reads every byte)."""
    path = Path(path)
    folder, passed = newest_readable(path, verify)
    if folder is None:
        rows = CheckpointStore(checkpoints_root(path)).listing()
        for row in rows:
            row["loadable"] = passed.get(row["path"], row["loadable"])
        return {"checkpoint": f"none loadable under {path}", "checkpoints": rows}
    meta = CheckpointStore(folder.parent).read_meta(folder)
    sizes = meta.get("files", {})
    out = {
        "checkpoint": str(folder),
        "step": meta["step"],
        "epoch": meta.get("epoch"),
        "engine": meta["engine"],
        "recipe_engine": meta.get("recipe_engine", meta["engine"]),  # older checkpoints: the same
        "world_size": meta["world_size"],
        "recipe": meta.get("recipe"),
        "samples_seen": meta.get("samples_seen"),
        "bytes": sum(sizes.values()),
        "files": len(sizes),
    }
    if verify:
        out["checksums"] = "verified" if meta.get("checksums") else "none recorded (saved before checksums were)"
    if (folder / "dcp").is_dir():
        keys = tensor_keys(folder)
        for part in ("student", "teacher", "optimizer"):
            prefix = f"engine.{part}."
            out[f"{part}_tensors"] = sum(1 for k in keys if k.startswith(prefix))
        model = {}
        for part in ("student", "teacher"):
            if out[f"{part}_tensors"]:
                model.update({f"{part}.{k}": t for k, t in read_tensors(folder, f"engine.{part}.").items()})
        out["model_checksum"] = checksum(model)
    out["checkpoints"] = CheckpointStore(folder.parent).listing()  # every one, to choose train.resume_step from
    for row in out["checkpoints"]:
        row["loadable"] = passed.get(row["path"], row["loadable"])
    return out


def deepspeed_tensors(folder: Path, what: str) -> dict[str, torch.Tensor]:
    """A DeepSpeed ZeRO-1/2 step directory's student (its model states file) or teacher (teacher.pt), read as data
    (check_files has read every file with weights_only first)."""
    from scale.checkpoint.safe_load import load_torch

    engine = folder / "engine"
    part, sub = WHAT[what].split(".")[1], WHAT[what].split(".", 2)[2]
    if part == "teacher":
        if not (engine / "teacher.pt").is_file():
            raise UserError(
                f"{folder}: no teacher.pt (a ZeRO-3 run's teacher is sharded: export --what student-backbone)"
            )
        state = load_torch(engine / "teacher.pt")
    else:
        files = sorted(engine.glob("*/mp_rank_00_model_states.pt"))
        if not files:
            raise UserError(f"{folder}: no DeepSpeed model states file")
        state = load_torch(files[0])["module"]
        if not state:
            raise UserError(f"{folder}: a ZeRO-3 checkpoint holds no full weights: resume it and export from DDP/FSDP2")
    state = {k.replace("_checkpoint_wrapped_module.", ""): v for k, v in state.items()}
    return {k[len(sub) :]: v.float() if v.is_floating_point() else v for k, v in state.items() if k.startswith(sub)}


def net_tensors(folder: Path, what: str) -> dict[str, torch.Tensor]:
    """The consolidated tensors of `what` (WHAT), from a DCP or a DeepSpeed step directory."""
    if (folder / "dcp").is_dir():
        return read_tensors(folder, WHAT[what])
    return deepspeed_tensors(folder, what)


def export(path: str | Path, what: str, fmt: str, out: str | Path, license: str = "other") -> Path:
    if what not in WHAT:
        raise UserError(f"--what must be one of {', '.join(WHAT)}, got '{what}'")
    folder = checked(path)
    tensors = net_tensors(folder, what)
    out = Path(out)
    if fmt in ("timm", "hf"):
        from scale.checkpoint.share import write_timm
        from scale.config.load import from_dict

        run_dir = folder.parent.parent
        if not (run_dir / "config.yaml").is_file():
            raise UserError(f"{run_dir}: no config.yaml (the model's shape comes from the run's recipe)")
        if not what.endswith("backbone"):
            raise UserError(f"--format {fmt} exports a backbone: --what teacher-backbone or student-backbone")
        cfg = from_dict(read_yaml(run_dir / "config.yaml", RUN_CONFIG_WITH_MODEL), str(run_dir / "config.yaml"))
        step = CheckpointStore(folder.parent).read_meta(folder)["step"]
        with _writing(out, folder=True):
            return write_timm(tensors, cfg, run_dir, step, what, out, hub=fmt == "hf", license=license)
    if fmt not in ("safetensors", "torch"):
        raise UserError(f"--format must be safetensors, torch, timm or hf, got '{fmt}'")
    with _writing(out, folder=False):
        out.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "safetensors":
            from safetensors import SafetensorError
            from safetensors.torch import save_file

            try:
                save_file({k: t.contiguous() for k, t in tensors.items()}, str(out))
            except SafetensorError as err:  # its writer's I/O errors are no OSError
                raise UserError(f"--out {out}: cannot write there: {err}") from None
        else:
            with open(out, "wb") as f:  # opened here: torch's own writer fails with a RuntimeError, no OSError
                torch.save(tensors, f)
    return out


@contextmanager
def _writing(out: Path, folder: bool):
    """Writing the export to --out: a folder where a file is wanted (or the reverse), or a place that cannot be
    written, is one line naming --out (exit 2), not the writer's traceback."""
    if folder and out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: an existing file; --format timm|hf writes a folder")
    if not folder and out.is_dir():
        raise UserError(
            f"--out {out}: a folder; --format safetensors|torch writes a file (name it, e.g. {out}/model.safetensors)"
        )
    try:
        yield
    except (OSError, RuntimeError) as err:
        cause = os_error(err)
        if cause is None:
            raise
        where = f" ({cause.filename})" if cause.filename and str(cause.filename) != str(out) else ""
        raise UserError(f"--out {out}: cannot write there: {cause.strerror or cause}{where}") from None
