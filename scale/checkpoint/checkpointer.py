"""Save and resume everything a run needs: the engine's state (student, teacher, optimizer, loss scaler) and the
run's state objects (scale.checkpoint.state: the method's centers and queues, the loader's global sample position,
every rank's RNG and data counters, the loop's monitors and probe), with the step. Resuming: scale.checkpoint.resume.

DDP and FSDP2 go through torch.distributed.checkpoint (sharded files, loadable on another world size); DeepSpeed
writes its own files. Either way the step directory is sealed by CheckpointStore, so a kill mid-write is harmless.
With train.async_save the write runs in the background and the directory is sealed as soon as it completes (a
done-callback doing only file work on rank 0); the next save or close waits for that seal.

A write that fails on any rank with an OSError (a full disk) stops every rank together: each rank notes its own
failure instead of raising it mid-write (where the others would wait for it in a collective), the ranks agree after
each phase (write, seal), and rank 0 removes the partial folder and says what failed (scale.checkpoint.diskspace).
"""

import logging
import shutil
import threading
import time
from functools import partial
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from omegaconf import DictConfig
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException

from scale.checkpoint.diskspace import weights_bytes, write_errors, write_failed
from scale.checkpoint.resume import Resumable
from scale.checkpoint.state import (
    Stateful,
    save_engine_files,
    write_states,
    write_torch,
)
from scale.checkpoint.store import CheckpointStore, epochs_done, file_sizes, step_name
from scale.engine.parallel import ParallelContext
from scale.errors import UserError, os_error
from scale.faults import maybe_fill_disk, maybe_inject

log = logging.getLogger(__name__)


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


class Checkpointer(Resumable):
    """The ranks of `info`'s data-parallel group save and load together (no group: one process)."""

    def __init__(self, root: Path, cfg: DictConfig, info: ParallelContext, engine, states: dict[str, Stateful]):
        """`states`: what the run saves besides the engine, by name (scale.checkpoint.state.run_states); "method"
        and "loader" are required (the teacher to reset, the loader's epoch length for meta.json)."""
        self.store = CheckpointStore(root)
        self.group = info.dp_group
        self.cfg, self.info, self.engine, self.states = cfg, info, engine, states
        self.method, self.loader = states["method"], states["loader"]
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

    def save(self, step: int) -> None:
        """Collective: every rank calls it at the same step."""
        started = time.perf_counter()
        self.wait()
        staging = self.store.staging_dir(step)
        prepared = self._attempt(self._prepare, step) if self.info.is_main else None
        self._agree_written(step, prepared)  # also the barrier: the staging folder exists
        meta = {
            "epoch": epochs_done(step, self.loader.steps_per_epoch),  # as metrics.jsonl records it (scale status)
            # the kind that wrote the files (what resume checks), and the recipe's engine.kind where the one rule
            # ran it as another (scale.engine.kinds.runs_as: fsdp2 as DDP on one rank)
            "engine": self.engine.kind,
            "recipe_engine": self.cfg.engine.kind,
            "world_size": self.info.world_size,
            "recipe": self.cfg.meta.name,
            "samples_seen": self.loader.state_dict().get("position"),
        }
        failed = self._attempt(write_states, self.states, staging, self.info.rank, self.info.is_main)
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

    def _write_engine(self, step: int, staging: Path) -> None:
        if self.engine.native_checkpoint:
            save_engine_files(self.engine, staging / "engine")
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
        self.store.record_save(
            {
                "step": step,
                "bytes": sum(self.store.read_meta(folder)["files"].values()),
                "save_s": save_s,
                "stall_s": stall_s,
                "async": bool(self.cfg.train.async_save),
            }
        )

    def close(self) -> None:
        self.wait()
