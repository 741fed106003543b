"""The heartbeat: rank 0's <run>/heartbeat.json, rewritten every few seconds by a thread from what the loop last
said (the step it runs, its phase: data, forward, backward, optimizer, checkpoint; when it last logged), so that
`scale status` shows a live run's phase and a long step shows its phase and elapsed time in the progress bar. The
phases are host-side boundaries: entering one is an attribute write, nothing waits for the device (on a GPU the
host runs ahead, and the wait shows in the phase that next syncs: the log step's read or the checkpoint)."""

import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path

from scale.nofollow import LinkRefused, write_atomic
from scale.readback import HEARTBEAT, BadFile, read_json

FILE = "heartbeat.json"
EVERY_S = 2.0  # seconds between writes
LONG_STEP_S = 5.0  # a step running this long shows its phase and elapsed time in the bar


class Heartbeat:
    def __init__(self, root: Path, enabled: bool, every_s: float = EVERY_S, long_step_s: float = LONG_STEP_S):
        self.path, self.enabled, self.every_s, self.long_step_s = root / FILE, enabled, every_s, long_step_s
        self.step, self.phase = 0, "starting"
        self.step_since = self.phase_since = time.time()
        self.last_log: float | None = None
        self.bar = None
        self._shown = 0.0  # when the bar last showed a long step's phase
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        if enabled:
            self.write()
            self._thread.start()

    def begin_step(self, step: int) -> None:
        """Step `step` (0-based) starts, with its data."""
        self.step, self.step_since = step + 1, time.time()
        self.enter("data")
        if self.bar is not None and self._shown:
            self.bar.set_description_str("train", refresh=False)
            self._shown = 0.0

    def enter(self, phase: str) -> None:
        self.phase, self.phase_since = phase, time.time()

    @contextlib.contextmanager
    def phase_of(self, phase: str):
        """TrainStep's `phase` hook: marks the phase's start (the next one marks its end)."""
        self.enter(phase)
        yield

    def logged(self) -> None:
        self.last_log = time.time()

    def state(self) -> dict:
        return {
            "step": self.step,
            "phase": self.phase,
            "phase_since": self.phase_since,
            "step_since": self.step_since,
            "last_log": self.last_log,
            "time": time.time(),
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }

    def write(self) -> None:
        try:
            write_atomic(self.path, json.dumps(self.state()))
        except (OSError, LinkRefused):  # a full or flaky file system must not stop training
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.write()
            self._show_long_step()

    def _show_long_step(self) -> None:
        now = time.time()
        bar = self.bar
        if bar is None or now - self.step_since < self.long_step_s or now - self._shown < bar.mininterval:
            return
        self._shown = now
        bar.set_description_str(
            f"train [step {self.step}: {self.phase} {now - self.phase_since:.0f}s, step {now - self.step_since:.0f}s]"
        )

    def close(self, phase: str = "stopped") -> None:
        if not self.enabled:
            return
        self._stop.set()
        self._thread.join()
        self.enter(phase)
        self.write()


def read_heartbeat(root: Path) -> dict | None:
    """Rank 0's last heartbeat, or None when there is none or it is damaged (`scale status` shows no phase)."""
    try:
        return read_json(root / FILE, HEARTBEAT)
    except (OSError, BadFile):
        return None
