"""`python tests/forked_ranks.py ARGS`: `scale ARGS`, whose `--nproc` ranks are forked from this launcher instead of
each starting a new interpreter (`python -m scale.cli`). The launcher of `scale train` has already imported what a
rank imports (torch, the engine, the checkpoints, the data) to check the recipe, so a forked rank starts in a moment
where an exec'd one spends ~10 CPU s on imports: the end-to-end tests that test training, checkpoints and resume,
not process start-up, launch through this (tests/helpers_run.py). The launcher, signal, chaos, Slurm and wheel
tests keep the exec path.

A forked rank is what an exec'd one is, as far as the launcher and the rank can tell: its own environment (the
launcher's with the rank's variables), its own process group and parent-death signal (the launcher's
preexec_fn), the signal handlers of a fresh interpreter, and `scale.cli.main` run with the rank's arguments."""

import os
import signal
import subprocess
import sys
import threading
import traceback
import types

sys.path.pop(0)  # this folder (tests/) on the path would shadow libraries by its sub-folders' names

import scale.cli  # noqa: E402
import scale.launch.local as local  # noqa: E402

# the handlers of a fresh interpreter, before the launcher installs its own (catch_early_signals, run_ranks)
FRESH_HANDLERS = {sig: signal.getsignal(sig) for sig in local.FORWARDED}


class ForkedRank:
    """The part of subprocess.Popen that scale.launch.local.Ranks uses, for a rank forked from this process."""

    def __init__(self, command, env, pass_fds=(), preexec_fn=None):
        self.returncode = None
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            _run_rank(command[3:], env, preexec_fn)  # never returns

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _run_rank(argv: list[str], env: dict, preexec_fn) -> None:
    """In the forked rank: `python -m scale.cli *argv` as an exec'd rank would run it, then exit with its status."""
    code = 1
    try:
        for sig, handler in FRESH_HANDLERS.items():
            signal.signal(sig, handler)
        os.environ.clear()
        os.environ.update(env)
        if preexec_fn is not None:
            preexec_fn()
        sys.argv = [scale.cli.__file__, *argv]
        code = scale.cli.main(argv)
    except SystemExit as stop:  # as the interpreter reports it: None is 0, a message is printed and 1
        code = stop.code if isinstance(stop.code, int) else stop.code is not None
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))


def start_rank(command, **kwargs):
    """A rank of `python -m scale.cli` forked from this process while it has one thread (a fork beside other
    threads may inherit a lock one of them holds); any other command, or beside threads, exec'd as before."""
    if command[1:3] == ["-m", "scale.cli"] and threading.active_count() == 1:
        return ForkedRank(command, **kwargs)
    return subprocess.Popen(command, **kwargs)


if __name__ == "__main__":
    # scale.launch.local's view of the subprocess module: its ranks started by start_rank
    local.subprocess = types.SimpleNamespace(Popen=start_rank)
    sys.exit(scale.cli.main())
