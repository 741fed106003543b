"""Spawn N local processes of a `scale` command (CPU/gloo runs, the demo and tests), with torchrun's variables.

Under torchrun or srun this is not used: those launchers start the processes themselves.
"""

import atexit
import ctypes
import os
import signal
import subprocess
import sys
import time

from scale import faults
from scale.errors import LAUNCH_MARK, PREEMPTED_EXIT_CODE

# set by `scale train --nproc N` in its ranks: the launcher ran the launch's start-up checks, the ranks skip them
CHECKED = "SCALE_STARTUP_CHECKED"
# what a new launch must not inherit from its caller: a process group's variables and the launch marks (they would
# make it join the caller's group, skip spawning or its checks), and a fault meant for another run
INHERITED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", LAUNCH_MARK, CHECKED, faults.ENV)


def fresh_environment() -> dict[str, str]:
    """This process's environment without the INHERITED variables."""
    return {k: v for k, v in os.environ.items() if k not in INHERITED}


def already_launched() -> bool:
    return any(k in os.environ for k in ("RANK", "SLURM_PROCID", LAUNCH_MARK))


def spawn(nproc: int, argv: list[str], pass_fds: tuple[int, ...] = (), env: dict[str, str] | None = None) -> int:
    """Run `python -m scale.cli *argv` in nproc processes (see `run_ranks`), `env` added to their environment."""
    return run_ranks(nproc, [sys.executable, "-m", "scale.cli", *argv], pass_fds=pass_fds, env=env)


def run_ranks(
    nproc: int,
    command: list[str],
    grace_s: float = 5.0,
    stop_grace_s: float | None = None,
    pass_fds: tuple[int, ...] = (),
    env: dict[str, str] | None = None,
) -> int:
    """Run `command` in nproc processes with torchrun's variables and wait for them (see `Ranks`). SIGTERM and
    SIGUSR1 are forwarded to every rank (so preemption reaches each one), SIGHUP and SIGINT as SIGTERM (a closed
    terminal, Ctrl-C: checkpoint and stop). The ranks run in their own process group, so a terminal's signals reach
    them only through the launcher, and die with it if it is killed. `pass_fds`: open files the ranks inherit (the
    run directory's lock). Returns the first failure's status, else PREEMPTED_EXIT_CODE or 0."""
    from scale.engine.dist import free_port  # torch: `scale train` catches early signals before importing it

    port = str(free_port())
    ranks = Ranks(grace_s, STOP_GRACE_S if stop_grace_s is None else stop_grace_s)
    # installed before the first rank starts: a signal during start-up is forwarded, never the launcher's death
    previous = {s: signal.signal(s, ranks.forward) for s in FORWARDED}
    for signum in early_signals():  # one that came before (see catch_early_signals): no rank is started
        ranks.forward(signum, None)
    try:
        for rank in range(nproc if not ranks.signalled else 0):
            rank_env = dict(
                os.environ,
                **(env or {}),
                RANK=str(rank),
                WORLD_SIZE=str(nproc),
                LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                **{LAUNCH_MARK: "1"},
            )
            ranks.procs.append(subprocess.Popen(command, env=rank_env, pass_fds=pass_fds, preexec_fn=_rank_process))
        if not ranks.procs:
            print(
                f"scale: stopped by {signal.Signals(ranks.signalled[0]).name} before the ranks started", file=sys.stderr
            )
            return PREEMPTED_EXIT_CODE
        ranks.forward_pending()
        return ranks.wait()
    finally:
        ranks.kill_all()  # only the launcher's own crash leaves ranks behind here
        for sig, handler in previous.items():
            signal.signal(sig, handler)


FORWARDED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
# what the ranks receive for each: they checkpoint on SIGTERM and SIGUSR1 (train.preempt_signals), while SIGINT
# would end them with KeyboardInterrupt and SIGHUP by its default action
AS_SIGNAL = {signal.SIGINT: signal.SIGTERM, signal.SIGHUP: signal.SIGTERM}
_early: list[int] = []


def catch_early_signals() -> None:
    """Record the FORWARDED signals from the start of `scale train --nproc N`: one that comes while the recipe is
    loaded and checked (before run_ranks installs its handlers) stops the launch with PREEMPTED_EXIT_CODE instead
    of killing the launcher."""
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: _early.append(signum))
    ignore_at_exit(FORWARDED)


_ignored_at_exit: set[int] = set()


def ignore_at_exit(signals) -> None:
    """Ignore `signals` from the moment this process starts to exit. Python's finalization puts back the default
    action of every signal it has a handler for, so one more preemption signal then (ten SIGUSR1 in a second at a
    rank that has checkpointed) killed the process, and the launch reported 128 + the signal where it was exiting
    with PREEMPTED_EXIT_CODE: Slurm would not requeue it. An ignored signal is left ignored."""
    if not _ignored_at_exit:
        atexit.register(lambda: [signal.signal(s, signal.SIG_IGN) for s in _ignored_at_exit])
    _ignored_at_exit.update(signals)


def early_signals() -> list[int]:
    caught, _early[:] = list(_early[:1]), []
    return caught


_PR_SET_PDEATHSIG = 1


def _rank_process() -> None:
    """In a rank, before exec: its own process group (a terminal's Ctrl-C and hang-up reach the launcher only, which
    forwards them), and SIGTERM when the launcher dies, even by SIGKILL (Linux), so that no rank is left behind:
    the ranks checkpoint on it, still holding the run directory's lock."""
    os.setpgid(0, 0)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):  # not Linux
        return


# how long ranks may take to checkpoint and exit after a forwarded signal before they are killed (a rank stuck in a
# collective, e.g. beside a dead peer, takes the signal as a preemption request and would never reach the next step)
STOP_GRACE_S = float(os.environ.get("SCALE_STOP_GRACE_S", "120"))
# a signal within this time of the first is the same notice delivered twice, not a second request
DUPLICATE_WINDOW_S = 2.0


class Ranks:
    """The launched ranks and the rules that end them:
    - a rank that fails (non-zero status other than PREEMPTED_EXIT_CODE, or killed) stops the others after
      `grace_s` (SIGTERM), and kills them `grace_s` later if they are stuck;
    - a preempted rank does not stop the others (they may still be writing their share of the checkpoint);
    - a forwarded signal gives the ranks `stop_grace_s` to checkpoint and exit, then they are killed; a second
      signal (more than DUPLICATE_WINDOW_S after the first) kills them at once;
    - a rank that dies of the signal that was forwarded to it (it came before the rank installed its handler, in
      the first seconds of start-up) counts as preempted: nothing was lost, the last sealed checkpoint stands."""

    def __init__(self, grace_s: float, stop_grace_s: float):
        self.procs: list[subprocess.Popen] = []
        self.grace_s, self.stop_grace_s = grace_s, stop_grace_s
        self.signalled: list[int] = []  # signals forwarded, in order
        self.first_signal_at = self.kill_at = None
        self.forced = False  # the ranks were killed after a signal: their deaths are no failure of their own

    def forward(self, signum, _frame) -> None:
        now = time.monotonic()
        again = self.signalled and (now - self.first_signal_at > DUPLICATE_WINDOW_S or signum == signal.SIGINT)
        if again:  # Ctrl-C twice: stop now
            print("scale: second signal: killing every rank", file=sys.stderr, flush=True)
            self.signalled.append(signum)
            self.forced = True
            self.kill_all()
            return
        if self.signalled:  # the same notice twice (`timeout` signals its child, then the child's group)
            return
        self.signalled.append(signum)
        self.first_signal_at, self.kill_at = now, now + self.stop_grace_s
        self.forward_pending()

    def forward_pending(self) -> None:
        """Send the forwarded signal to every running rank (also to those started after it came)."""
        for proc in self.procs:
            if self.signalled and proc.poll() is None:
                proc.send_signal(AS_SIGNAL.get(self.signalled[0], self.signalled[0]))

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()

    def wait(self) -> int:
        first_failure = None
        while True:
            running = [p for p in self.procs if p.poll() is None]  # polls every rank, not only up to a live one
            failed = [p.returncode for p in self.procs if p.returncode not in (None, 0, PREEMPTED_EXIT_CODE)]
            if failed and first_failure is None and not self.forced:  # not the ranks we killed ourselves
                first_failure = failed[0]
                self._stop(running)
            elif not running:
                break
            elif self.kill_at is not None and time.monotonic() > self.kill_at and not self.forced:
                print(
                    f"scale: ranks still running {self.stop_grace_s:.0f} s after the signal: killing them",
                    file=sys.stderr,
                )
                self.forced = True
                self.kill_all()
            time.sleep(0.1)
        if first_failure is not None:
            return self.status_of(first_failure)
        if self.forced:
            return 1
        return PREEMPTED_EXIT_CODE if PREEMPTED_EXIT_CODE in [p.returncode for p in self.procs] else 0

    def status_of(self, code: int) -> int:
        """A rank's status as the launcher reports it: a death by the forwarded signal is a preemption, another
        signal death is 128 + the signal (as a shell reports it)."""
        if code < 0:
            sent = [AS_SIGNAL.get(s, s) for s in self.signalled]
            return PREEMPTED_EXIT_CODE if -code in sent else 128 - code
        return code

    def _stop(self, running: list[subprocess.Popen]) -> None:
        """The others may report the failure themselves within grace_s; then SIGTERM, then SIGKILL for ranks stuck
        in a collective with the dead one (they take SIGTERM as a preemption request and never see the next step)."""
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and any(p.poll() is None for p in running):
            time.sleep(0.1)
        for proc in running:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and any(p.poll() is None for p in running):
            time.sleep(0.1)
        self.kill_all()
