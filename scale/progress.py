"""Progress of long work (training steps, shards written or verified), on the main rank only: a tqdm bar on a
terminal; in a file (a Slurm log, a pipe) whole lines every LINE_EVERY_S seconds instead, so that no `\r` bar update
is written and no log record is glued to a bar."""

import sys
import time

from tqdm import tqdm

LINE_EVERY_S = 30.0  # a non-terminal's progress line interval


class ProgressLines:
    """tqdm's update / set_postfix / close, and iteration, writing one whole line at most every `every` seconds
    (and at the end): `train: 120/1000 (12%), 2.55 s/it, loss=3.4815`."""

    def __init__(self, iterable=None, total=None, initial=0, desc="", enabled=True, every=LINE_EVERY_S, file=None):
        self.iterable, self.total, self.n, self.desc = iterable, total, initial, desc or "progress"
        self.enabled, self.every, self.file = enabled, every, file or sys.stderr
        self.postfix, self.start_n, self.started = "", initial, time.monotonic()
        self.last_line, self.last_n = self.started, initial

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self.last_line >= self.every:
            self._line()

    @property
    def mininterval(self) -> float:  # tqdm's name: the heartbeat shows a long step's phase at most this often
        return self.every

    @mininterval.setter
    def mininterval(self, value: float) -> None:
        self.every = value

    def set_description_str(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc
        if refresh and time.monotonic() - self.last_line >= self.every:
            self._line()

    def set_postfix(self, **values) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        if self.n != self.last_n:
            self._line()

    def _line(self) -> None:
        self.last_line, self.last_n = time.monotonic(), self.n
        if not self.enabled:
            return
        done = self.n - self.start_n
        rate = f", {(self.last_line - self.started) / done:.2f} s/it" if done else ""
        total = f"/{self.total} ({100 * self.n / self.total:.0f}%)" if self.total else ""
        postfix = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {self.n}{total}{rate}{postfix}", file=self.file, flush=True)


def progress_bar(total=None, initial: int = 0, enabled: bool = True, desc: str = "", iterable=None, unit="it"):
    """A tqdm bar on a terminal, ProgressLines elsewhere."""
    if sys.stderr.isatty():
        return tqdm(
            iterable,
            total=total,
            initial=initial,
            disable=not enabled,
            desc=desc,
            unit=unit,
            dynamic_ncols=True,
            mininterval=0.5,
            file=sys.stderr,
        )
    return ProgressLines(iterable, total, initial, desc, enabled)
