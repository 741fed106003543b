"""Save and resume everything a run needs: engine state (student, teacher, optimizer, loss scaler), method state
(centers, queues), the loader's global sample position, the step, every rank's RNG and data counters (data/samples,
data/errors, the error budget's count) and the loop's monitors.

DDP and FSDP2 go through torch.distributed.checkpoint (sharded files, loadable on another world size); DeepSpeed
writes its own files. Either way the step directory is sealed by CheckpointStore, so a kill mid-write is harmless.
With train.async_save the write runs in the background and the directory is sealed as soon as it completes (a
done-callback doing only file work on rank 0); the next save or close waits for that seal.

A write that fails on any rank with an OSError (a full disk) stops every rank together: each rank notes its own
failure instead of raising it mid-write (where the others would wait for it in a collective), the ranks agree after
each phase (write, seal), and rank 0 removes the partial folder and says what failed (scale.checkpoint.diskspace).
"""

import json
import logging
import shutil
import threading
import time
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from omegaconf import DictConfig
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException

from scale.checkpoint import state as rng
from scale.checkpoint.diskspace import weights_bytes, write_errors, write_failed
from scale.checkpoint.fit import check_deepspeed_fits, check_fits
from scale.checkpoint.safe_load import SafeLoadPlanner, SafeReader, UnsafeCheckpoint, check_files, load_torch
from scale.checkpoint.steering import Steering, pending, record
from scale.checkpoint.store import CheckpointStore, epochs_done, file_sizes, step_name, step_of
from scale.engine import rollback
from scale.engine.parallel import ParallelContext
from scale.errors import UserError, os_error
from scale.faults import maybe_fill_disk, maybe_inject
from scale.nofollow import open_text

log = logging.getLogger(__name__)
MONITORS_FILE = "monitors.pt"
COUNTERS_DIR = "data_counters"  # rankN.json: the loader's counters (data/samples, data/errors, the error budget)


def write_torch(obj, path: Path) -> None:
    """torch.save through a Python file: a full disk is then an OSError with its errno (torch's own file writer
    raises a RuntimeError, 'unexpected pos')."""
    with open(path, "wb") as f:
        torch.save(obj, f)


class DcpWriter(FileSystemWriter):
    """DCP's file writer, raising the OSError behind a failed write itself: DCP sends each rank's failure to every
    rank pickled, which keeps an OSError's errno but drops the chain behind the RuntimeError that torch.save raises
    on top of it ('unexpected pos', when the disk fills mid-file)."""

    def write_data(self, plan, planner):
        try:
            return super().write_data(plan, planner)
        except Exception as err:
            found = os_error(err)
            if found is None or found is err:
                raise
            raise found from None


# what a rank found when it read its share of a checkpoint's files; the ranks agree on the worst
READABLE, DAMAGED, UNSAFE = 0, 1, 2


class Checkpointer:
    """The ranks of `info`'s data-parallel group save and load together (no group: one process)."""

    def __init__(self, root: Path, cfg: DictConfig, info: ParallelContext, engine, method, loader, monitors):
        self.store = CheckpointStore(root)
        self.group = info.dp_group
        self.cfg, self.info, self.engine, self.method, self.loader = cfg, info, engine, method, loader
        self.monitors = monitors
        self._pending = None  # (step, future, sealed event) of an async save the next save or close waits for
        self._seal_error = None  # what went wrong sealing an async save, raised by wait()
        # async saves run collectives from a background thread: they get a process group of their own, so they
        # never interleave with the training step's collectives on the main group (which hangs gloo)
        self._async_group = dist.new_group(backend="gloo") if cfg.train.async_save and dist.is_initialized() else None
        self.last_save_stall_s = 0.0
        self.steered = False  # whether resume() applied train.resume_step/train.reset (a new timeline from there)

    def has(self, step: int) -> bool:
        return (self.store.root / step_name(step)).is_dir() or (self._pending is not None and self._pending[0] == step)

    # --- saving ---

    def _run_state(self, step: int) -> dict:
        return {"step": step, "method": self.method.state_dict(), "loader": self.loader.state_dict()}

    def save(self, step: int) -> None:
        """Collective: every rank calls it at the same step."""
        started = time.perf_counter()
        self.wait()
        staging = self.store.staging_dir(step)
        prepared = self._attempt(self._prepare, step) if self.info.is_main else None
        self._agree_written(step, prepared)  # also the barrier: the staging folder exists
        meta = {
            "epoch": epochs_done(step, self.loader.steps_per_epoch),  # as metrics.jsonl records it (scale status)
            "engine": self.cfg.engine.kind,
            "world_size": self.info.world_size,
            "recipe": self.cfg.meta.name,
            "samples_seen": self.loader.state_dict().get("position"),
        }
        monitors = self.monitors.state_dict()  # a collective; then the same on every rank
        failed = self._attempt(self._write_own, staging, monitors)
        if self.cfg.train.async_save and not self.engine.native_checkpoint:
            self._agree_written(step, failed)
            self._save_async(step, staging, meta, started)
            return
        failed = self._attempt(self._write_engine, step, staging) or failed  # every rank takes part, whatever failed
        self._agree_written(step, failed)
        self._seal(step, meta, started)
        self.last_save_stall_s = time.perf_counter() - started

    def _prepare(self, step: int) -> None:
        maybe_fill_disk(self.store.prepare(step), step)

    def _write_own(self, staging: Path, monitors: dict) -> None:
        """This rank's RNG and data counters (per rank: DCP keeps one rank's copy of a non-tensor item, and they
        differ by rank); the monitors (the same on every rank) from rank 0."""
        (staging / "rng").mkdir(exist_ok=True)
        write_torch(rng.capture(), staging / "rng" / f"rank{self.info.rank}.pt")
        (staging / COUNTERS_DIR).mkdir(exist_ok=True)
        (staging / COUNTERS_DIR / f"rank{self.info.rank}.json").write_text(json.dumps(self.loader.counters()))
        if self.info.is_main:
            write_torch(monitors, staging / MONITORS_FILE)

    def _write_engine(self, step: int, staging: Path) -> None:
        if self.engine.native_checkpoint:
            self.engine.save_native(staging / "engine")
            if self.info.is_main:
                write_torch(self._run_state(step), staging / "run_state.pt")
        else:
            dcp.save(
                {"engine": self.engine.state_dict(), "run": self._run_state(step)},
                storage_writer=DcpWriter(staging / "dcp"),
                process_group=self.group,
            )

    def _save_async(self, step: int, staging: Path, meta: dict, started: float) -> None:
        future = dcp.async_save(
            {"engine": self.engine.state_dict(), "run": self._run_state(step)},
            storage_writer=DcpWriter(staging / "dcp"),
            process_group=self._async_group,
        )
        self.last_save_stall_s = time.perf_counter() - started
        sealed = threading.Event()
        self._pending = (step, future, sealed)
        future.add_done_callback(partial(self._seal_written, step, meta, started, self.last_save_stall_s, sealed))

    def wait(self) -> None:
        """Wait for an async save still in flight and its seal; then every rank goes on together (or stops
        together, when a rank's write or rank 0's seal failed)."""
        if self._pending is None:
            return
        step, future, sealed = self._pending
        self._pending = None
        sealed.wait()  # set by the done-callback: the future is done too
        error, self._seal_error = self._seal_error or future.exception(), None
        if error is not None and not write_errors(error, self.info.rank):
            raise error
        self._agree_written(step, error)

    def _seal_written(self, step: int, meta: dict, started: float, stall_s: float, sealed, future) -> None:
        """Done-callback of an async save, on the thread that finished the write: seal it now, host work only (no
        collective from this thread). When DCP's future is done on rank 0, every rank's files are on disk: its
        coordinator writes .metadata only after gathering every rank's write results."""
        try:
            if future.exception() is None:
                maybe_inject("save", step)
                if self.info.is_main:
                    self._commit(step, meta, time.perf_counter() - started, stall_s)
        except Exception as err:  # raised on the main thread by wait()
            self._seal_error = err
        finally:
            sealed.set()

    def _seal(self, step: int, meta: dict, started: float) -> None:
        """After the ranks agreed that every file is on disk."""
        maybe_inject("save", step)
        failed = None
        if self.info.is_main:
            total_s = time.perf_counter() - started
            failed = self._attempt(self._commit, step, meta, total_s, total_s)
        self._agree_written(step, failed)

    def _attempt(self, write, *args) -> BaseException | None:
        """Run this rank's part of a write; a failure of the file system is returned (for _agree_written), any
        other raised."""
        try:
            write(*args)
        except (Exception, CheckpointException) as err:  # CheckpointException is no Exception subclass
            if not write_errors(err, self.info.rank):
                raise
            return err
        return None

    def _agree_written(self, step: int, error: BaseException | None) -> None:
        """Collective (it is also the barrier after a write phase): when any rank's write failed, every rank stops
        (exit 2; rank 0 removes the step's partial folder and says what failed, once)."""
        if not self._worst(int(error is not None)):
            return
        failures = write_errors(error, self.info.rank) if error is not None else []
        if dist.is_initialized():
            every = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(every, failures, group=self.group)
            failures = [failure for found in every for failure in found]
        if self.info.is_main:
            staging = self.store.staging_dir(step)
            written = sum(file_sizes(staging).values()) if staging.is_dir() else 0
            shutil.rmtree(staging, ignore_errors=True)
            first = weights_bytes(self.method.student, self.method.teacher)
            run_dir = self.store.root.parent  # checkpoints/ is a folder of the run directory (scale.loop.rundir)
            raise UserError(write_failed(self.store.root, run_dir, step, failures, written, first))
        raise SystemExit(UserError.exit_code)  # rank 0 says why

    def _commit(self, step: int, meta: dict, save_s: float, stall_s: float) -> None:
        final = self.store.commit(step, meta)
        self._record(step, final, save_s, stall_s)
        removed = self.store.retain(self.cfg.train.keep_last, self.cfg.train.keep_every)
        log.info("checkpoint %s%s", final, f" (removed {len(removed)} old)" if removed else "")

    def _record(self, step: int, folder: Path, save_s: float, stall_s: float) -> None:
        """One line per sealed checkpoint in checkpoints/saves.jsonl: size, time to disk, and how long training
        waited for it (the whole save when synchronous; the staging copy when asynchronous)."""
        record = {
            "step": step,
            "bytes": sum(self.store.read_meta(folder)["files"].values()),
            "save_s": save_s,
            "stall_s": stall_s,
            "async": bool(self.cfg.train.async_save),
        }
        with open_text(self.store.root / "saves.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self.wait()

    # --- collectives ---

    def _barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier(group=self.group)

    def _broadcast(self, value):
        if not dist.is_initialized():
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def _worst(self, value: int) -> int:
        """The largest of every rank's `value`."""
        if not dist.is_initialized():
            return value
        flag = torch.tensor([value], dtype=torch.int32)
        if dist.get_backend(self.group) == "nccl":
            flag = flag.cuda()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return int(flag.item())

    # --- resuming ---

    def resume(self) -> int:
        """Load the newest checkpoint that every rank can load (skipping damaged ones with a warning naming the
        file), or the one train.resume_step names; the step to continue from. Every rank first reads its share of
        the files as data, then the ranks agree, so that they all load the same checkpoint. A file that would run
        code, or a checkpoint that does not fit this run's shapes, ends the run (exit 2) with nothing deleted.
        Checkpoints newer than the one loaded are moved to checkpoints/set_aside/, out of retention's reach."""
        plan = self._broadcast(self._plan() if self.info.is_main else None)
        if "error" in plan:
            self._fail(plan["error"])
        steering = Steering(plan["step"], tuple(plan["reset"]))
        for folder in map(Path, plan["folders"]):
            verdict, problem = self._check(folder)
            worst = self._worst(verdict)
            if worst == UNSAFE:
                if isinstance(problem, UnsafeCheckpoint):
                    raise problem
                raise SystemExit(UnsafeCheckpoint.exit_code)  # the rank that found it says why, once
            if worst == READABLE:
                try:
                    step = self.load(folder, steering.reset)
                except UserError:
                    raise
                except (Exception, CheckpointException) as err:  # CheckpointException is no Exception subclass
                    verdict, problem = DAMAGED, f"{type(err).__name__}: {err}"
                worst = self._worst(verdict)
            if worst == READABLE:
                log.info("resumed from %s at step %d", folder, step)
                return self._steered(step, steering)
            if problem:
                log.warning("skipping checkpoint %s: %s; trying the previous one", folder, problem)
            else:
                log.info("skipping checkpoint %s: another rank cannot load its part", folder)
        if steering.step is not None:
            self._fail(f"train.resume_step={steering.step}: the checkpoint of that step cannot be loaded (above)")
        self._set_aside(0)  # none loadable (or none at all): a fresh start never overwrites a damaged one
        return 0

    def _fail(self, message: str) -> None:
        """A user error every rank found: rank 0 says it, the others exit with its status silently."""
        if self.info.is_main:
            raise UserError(message)
        raise SystemExit(UserError.exit_code)

    def _plan(self) -> dict:
        """On rank 0: the folders to try, newest first, and what train.resume_step/train.reset still ask for."""
        steering = pending(self.cfg.train, self.store.root)
        folders = self.store.candidates()
        if steering.step is not None:
            folders = [f for f in folders if step_of(f) == steering.step]
            if not folders:
                sealed = [step_of(f) for f in self.store.candidates()]
                return {
                    "error": f"train.resume_step={steering.step}: no sealed checkpoint of that step in "
                    f"{self.store.root} (sealed: {sealed or 'none'}; `scale ckpt info {self.store.root}`)"
                }
        return {"folders": [str(f) for f in folders], "step": steering.step, "reset": list(steering.reset)}

    def _steered(self, step: int, steering: Steering) -> int:
        """Apply train.reset's 'schedules' and 'ema' after a load; set newer checkpoints aside; record it."""
        if "ema" in steering.reset and self.method.teacher is not None:
            self.engine.ema(0.0)  # teacher = student, through each engine's own EMA (sharded or not)
            log.info("train.reset: the teacher restarts as a copy of the student")
        start = 0 if "schedules" in steering.reset else step
        if start != step:
            log.info("train.reset: the step count restarts at 0 (schedules from the start), weights of step %d", step)
        aside = self._set_aside(start if start == step else -1)
        self.steered = steering != Steering()
        if self.steered and self.info.is_main:
            record(self.store.root, steering, step, aside)
        return start

    def _set_aside(self, after: int) -> Path | None:
        """Collective: rank 0 moves the checkpoints newer than step `after` aside (they are kept)."""
        aside = self.store.set_aside(after) if self.info.is_main else None
        if aside is not None:
            log.warning("moved the checkpoints newer than step %d to %s (kept, not deleted)", max(after, 0), aside)
        self._barrier()
        return aside

    def _check(self, folder: Path) -> tuple[int, object]:
        try:
            problem = check_files(folder, self.info.rank, self.info.world_size)
        except UnsafeCheckpoint as err:
            return UNSAFE, err
        return (DAMAGED, problem) if problem else (READABLE, None)

    def load(self, folder: Path, reset: tuple[str, ...] = ()) -> int:
        """Load `folder`; `reset` (train.reset) names the parts left fresh: 'optimizer' and 'data' are not read."""
        meta = self.store.read_meta(folder)
        if meta["engine"] != self.cfg.engine.kind:
            raise UserError(
                f"{folder} was written by engine '{meta['engine']}', this run uses "
                f"'{self.cfg.engine.kind}': resume with engine.kind={meta['engine']}"
            )
        optimizer = "optimizer" not in reset
        if self.engine.native_checkpoint:
            check_deepspeed_fits(self.engine, folder / "engine", self.info.is_main)
            self.engine.load_native(folder / "engine", meta["world_size"], optimizer=optimizer)
            run_state = load_torch(folder / "run_state.pt")
        else:
            state = {"engine": self.engine.state_dict(), "run": self._run_state(0)}
            if not optimizer:
                state["engine"] = {k: v for k, v in state["engine"].items() if k not in ("optimizer", "scaler")}
            reader = SafeReader(str(folder / "dcp"))
            check_fits(folder, state, reader.read_metadata(), self.info.is_main)
            saved = rollback.snapshot(state)  # a load that fails half-way leaves none of its tensors
            try:
                dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), process_group=self.group)
            except BaseException:
                rollback.restore(saved)
                raise
            self.engine.load_state_dict(state["engine"])
            run_state = state["run"]
        self.method.load_state_dict(run_state["method"])
        if "data" in reset:
            log.info("train.reset: the loader starts at sample 0 with its counters at 0")
        else:
            self.loader.load_state_dict(run_state["loader"])
            self.loader.load_counters(self._saved_counters(folder, meta))
        if not optimizer:
            log.info("train.reset: fresh optimizer state (moments, loss scale); weights from %s", folder)
        self._restore_rng(folder, meta)
        if (folder / MONITORS_FILE).exists():  # checkpoints written before the monitors were saved lack it
            self.monitors.load_state_dict(load_torch(folder / MONITORS_FILE))
        return int(run_state["step"])

    def _saved_counters(self, folder: Path, meta: dict) -> dict:
        """This rank's counters at the same world size; at another, an even share of every saved rank's. A
        checkpoint written before the counters were saved has none: they start at 0."""
        saved = {}
        for path in sorted((folder / COUNTERS_DIR).glob("rank*.json")):
            try:
                state = json.loads(path.read_text())
                if not isinstance(state, dict):
                    raise ValueError(f"a JSON {type(state).__name__}, not an object")
                saved[int(path.stem.removeprefix("rank"))] = state
            except (OSError, ValueError) as err:
                log.warning("data counters %s unreadable (%s): they start at 0", path, err)
                return {}
        if meta["world_size"] == self.info.world_size:
            return saved.get(self.info.rank, {})
        kinds = {kind for state in saved.values() for kind in state.get("errors", {})}
        total = {
            "samples": sum(state.get("samples", 0) for state in saved.values()),
            "epoch_errors": sum(state.get("epoch_errors", 0) for state in saved.values()),
            **{kind: sum(state.get("errors", {}).get(kind, 0) for state in saved.values()) for kind in kinds},
        }
        rank, size = self.info.rank, self.info.world_size
        share = {key: n // size + (rank < n % size) for key, n in total.items()}
        return {
            "samples": share["samples"],
            "epoch_errors": share["epoch_errors"],
            "errors": {k: share[k] for k in kinds},
        }

    def _restore_rng(self, folder: Path, meta: dict) -> None:
        own = folder / "rng" / f"rank{self.info.rank}.pt"
        if meta["world_size"] == self.info.world_size and own.exists():
            rng.restore(load_torch(own))
        else:  # another world size: fresh, reproducible streams per rank, distinct from the first run's
            from scale.engine.dist import seed_everything

            seed_everything(self.cfg.train.seed + 1_000_003 * (1 + int(meta["step"])), self.info.rank)
