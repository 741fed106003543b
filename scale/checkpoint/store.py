"""Checkpoint directories on disk: atomic commit, the `latest` pointer, retention, finding the newest good one.

Layout: checkpoints/step_000001234/ (whatever the engine writes + rng/ + data_counters/ + meta.json) and checkpoints/latest (a text
file naming the newest step directory). A step directory is written under a `.tmp-` name and renamed when complete;
meta.json (with every file's size and checksum) is written before the rename, and `latest` is replaced last. A kill at any
moment therefore leaves the previous checkpoint loadable, and a partial or damaged directory is detectable.
"""

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

from scale.checkpoint.checksum import checksums
from scale.faults import maybe_inject_at
from scale.nofollow import open_text, write_atomic
from scale.readback import CHECKPOINT_META, SAVES_LINE, BadFile, read_json, read_json_lines

log = logging.getLogger(__name__)

META = "meta.json"
LATEST = "latest"
TMP_PREFIX = ".tmp-"
SAVES = "saves.jsonl"  # one line per sealed checkpoint: size and times (scale.readback's SAVES_LINE)
SET_ASIDE = "set_aside"  # checkpoints newer than the one a run resumed from: kept, out of retention's reach


def step_name(step: int) -> str:
    return f"step_{step:09d}"


STEP_DIR = re.compile(rf"({re.escape(TMP_PREFIX)})?step_(\d+)")


def step_of(folder: Path) -> int:
    return int(STEP_DIR.fullmatch(folder.name).group(2))


def _step_dirs(paths) -> list[Path]:
    """The step directories among `paths`, newest first: step_<digits> (a stray step_garbage is no checkpoint)."""
    return sorted((p for p in paths if STEP_DIR.fullmatch(p.name) and p.is_dir()), key=step_of, reverse=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_meta(staging: Path, text: str) -> None:
    """meta.json, inside the staging folder this run has just created (where a planted link cannot wait): a plain
    write through `meta.json.tmp`, the path the disk_fills fault points at /dev/full (scale.faults)."""
    tmp = staging / (META + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, staging / META)


def write_latest(root: Path, name: str) -> None:
    """checkpoints/latest, in the run directory: never written through a link (scale.nofollow)."""
    write_atomic(root / LATEST, name + "\n", fsync=True)


def file_sizes(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != META
    }


class CheckpointStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def staging_dir(self, step: int) -> Path:
        return self.root / f"{TMP_PREFIX}{step_name(step)}"

    def prepare(self, step: int) -> Path:
        """A fresh staging directory for this step (called on one rank; leftovers of a killed write go)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(f"{TMP_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = self.staging_dir(step)
        staging.mkdir(parents=True)
        return staging

    def commit(self, step: int, meta: dict) -> Path:
        """Seal the staging directory: meta.json with file sizes, rename, then move `latest`."""
        staging = self.staging_dir(step)
        files = file_sizes(staging)
        meta = {**meta, "step": step, "saved_at": time.time(), "files": files, "checksums": checksums(staging, files)}
        meta["complete"] = True
        _write_meta(staging, json.dumps(meta, indent=2))
        maybe_inject_at("seal", step, "meta")
        final = self.root / step_name(step)
        if final.exists():  # a re-save of the same step (e.g. preemption right after a periodic save)
            shutil.rmtree(final)
        os.replace(staging, final)
        _fsync_dir(self.root)
        maybe_inject_at("seal", step, "renamed")
        write_latest(self.root, final.name)
        maybe_inject_at("seal", step, "latest")
        return final

    def record_save(self, record: dict) -> None:
        """Append a sealed checkpoint's line to saves.jsonl (written by the checkpointer after commit())."""
        with open_text(self.root / SAVES, "a") as f:
            f.write(json.dumps(record) + "\n")

    def record_unrecorded(self) -> None:
        """After a resume, on one rank: a seal killed after its folder's rename and before its line (the `renamed`
        and `latest` stages of scale.faults' `seal`) left a sealed checkpoint that saves.jsonl does not list; its
        line is appended from its meta.json, the times it did not record left out (the schema's optional fields).
        Oldest first, so that the last line stays the newest checkpoint's (the free-space estimate reads it)."""
        path = self.root / SAVES
        try:
            recorded = {line["step"] for line in read_json_lines(path, SAVES_LINE, torn_tail=True)}
        except FileNotFoundError:
            recorded = set()
        except (BadFile, OSError):
            return  # only an estimate's record: the free-space check names a damaged one (scale.checkpoint.diskspace)
        for folder in reversed(self.step_dirs()):
            if step_of(folder) not in recorded and self.problem(folder) is None:
                self.record_save({"step": step_of(folder), "bytes": sum(self.read_meta(folder)["files"].values())})
                log.info("%s: recorded the sealed checkpoint %s, which its killed seal left out", path, folder.name)

    def step_dirs(self) -> list[Path]:
        return _step_dirs(self.root.glob("step_*"))

    @staticmethod
    def problem(folder: Path) -> str | None:
        """Why a step directory cannot be loaded, or None when it looks complete."""
        meta_path = folder / META
        if not meta_path.is_file():
            return "no meta.json (partial write)"
        try:
            meta = read_json(meta_path, CHECKPOINT_META)
        except BadFile as err:
            return f"meta.json: {err.detail}"
        except OSError as err:
            return f"meta.json unreadable ({err.strerror or err})"
        if not meta["complete"]:
            return "not marked complete"
        actual = file_sizes(folder)
        for name, size in meta["files"].items():
            if actual.get(name) != size:
                return f"file {name} is {actual.get(name, 'missing')} bytes, expected {size}"
        return None

    def candidates(self) -> list[Path]:
        """Complete step directories, newest first; damaged ones are skipped with a warning naming them."""
        good = []
        for folder in self.step_dirs():
            reason = self.problem(folder)
            if reason:
                log.warning("skipping checkpoint %s: %s", folder, reason)
            else:
                good.append(folder)
        return good

    def set_aside(self, after: int) -> Path | None:
        """Move every step directory newer than step `after` into set_aside/<time>-after_step_N/, so that a run
        resumed from `after` never overwrites or deletes them (retention and commit see only this folder's
        step_* directories); where they went, or None when there were none."""
        newer = [p for p in self.step_dirs() if step_of(p) > after]
        if not newer:
            return None
        dest = self.root / SET_ASIDE / f"{time.strftime('%Y%m%dT%H%M%S')}-after_step_{after}"
        dest.mkdir(parents=True, exist_ok=True)
        for folder in newer:
            os.replace(folder, dest / folder.name)
        _fsync_dir(self.root)
        kept = self.step_dirs()
        if kept:
            write_latest(self.root, kept[0].name)
        else:
            (self.root / LATEST).unlink(missing_ok=True)
        return dest

    def set_aside_dirs(self) -> list[Path]:
        """Step directories a rollback or a fallback moved aside, newest move first."""
        return sorted(_step_dirs((self.root / SET_ASIDE).glob("*/step_*")), key=lambda p: str(p), reverse=True)

    def staging_dirs(self) -> list[Path]:
        """Step directories still being written, or left by a write that was killed (never sealed)."""
        return _step_dirs(self.root.glob(f"{TMP_PREFIX}step_*"))

    def listing(self) -> list[dict]:
        """Every step directory, set-aside and unsealed ones too, newest step first: step, when it was sealed,
        whether it can be loaded (or why not), and where it lies relative to this folder."""
        rows = []
        staging = self.staging_dirs()
        for folder in self.step_dirs() + self.set_aside_dirs() + staging:
            problem = "not sealed (a write in progress, or killed)" if folder in staging else self.problem(folder)
            saved_at = None if problem else self.read_meta(folder).get("saved_at")
            rows.append(
                {
                    "step": step_of(folder),
                    "saved": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(saved_at)) if saved_at else None,
                    "loadable": problem or "yes",
                    "path": str(folder.relative_to(self.root)),
                }
            )
        return sorted(rows, key=lambda row: -row["step"])

    def read_meta(self, folder: Path) -> dict:
        """meta.json, checked against its schema (scale.readback): BadFile, a UserError, when it does not match
        (`problem` has already turned such a checkpoint away wherever candidates() chose it)."""
        return read_json(folder / META, CHECKPOINT_META)

    def retain(self, keep_last: int, keep_every: int) -> list[Path]:
        """Delete all but the newest `keep_last` and every `keep_every`-th step; returns what was deleted."""
        doomed = []
        for index, folder in enumerate(self.step_dirs()):
            step = step_of(folder)
            if index < max(keep_last, 1) or (keep_every and step % keep_every == 0):
                continue
            doomed.append(folder)
        for folder in doomed:
            # renamed first: a kill inside the deletion leaves a `.tmp-` folder that the next save's prepare()
            # removes, never a half-deleted step directory that each resume would report as damaged
            gone = self.root / f"{TMP_PREFIX}removed-{folder.name}"
            shutil.rmtree(gone, ignore_errors=True)
            os.replace(folder, gone)
            shutil.rmtree(gone, ignore_errors=True)
        return doomed


def checkpoints_root(path: str | Path) -> Path:
    """The checkpoints/ folder of a run directory, of that folder itself, or of one of its step directories;
    exit 2 (one line) for a path that is none of these."""
    path = Path(path)
    if path.name.startswith(("step_", TMP_PREFIX)) and path.is_dir():
        return path.parent
    if (path / "checkpoints").is_dir():
        return path / "checkpoints"
    if path.name == "checkpoints" and path.is_dir() or (path / LATEST).is_file() or any(path.glob("*step_*")):
        return path  # a checkpoints/ folder
    if (path / "config.yaml").is_file():
        return path / "checkpoints"  # a run that has not saved yet
    from scale.errors import UserError

    raise UserError(
        f"{path}: not a run directory (no checkpoints/ folder, config.yaml or step_* directory)"
        if path.exists()
        else f"{path}: no such run directory"
    )


def resolve(path: str | Path) -> Path:
    """A run directory, its checkpoints/ folder, or a step directory -> the newest complete step directory."""
    path = Path(path)
    if (path / META).is_file():
        return path
    root = checkpoints_root(path)
    if root != path and root.parent != path:  # a step directory, not sealed
        from scale.errors import UserError

        raise UserError(f"{path}: cannot be loaded: {CheckpointStore.problem(path)}")
    found = CheckpointStore(root).candidates()
    if not found:
        from scale.errors import UserError

        raise UserError(f"no complete checkpoint under {path} (`scale ckpt info {path}` lists what is there)")
    return found[0]


def epochs_done(steps_done: int, steps_per_epoch: int) -> float:
    """The epoch of a run that has taken `steps_done` steps: epochs completed, fractional (1.5: half-way through
    the second). The one definition that metrics.jsonl (`scale status`) and a checkpoint's meta (`scale ckpt info`)
    record; they disagreed (the epoch index of the last step vs steps done // steps per epoch)."""
    return round(steps_done / max(steps_per_epoch, 1), 4)
