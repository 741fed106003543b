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
import tempfile
import threading
import time
import traceback
import types
import warnings

if __name__ == "__main__":
    sys.path.pop(0)  # this folder (tests/) on the path would shadow libraries by its sub-folders' names

import scale.cli  # noqa: E402
import scale.launch.local as local  # noqa: E402

# the handlers of a fresh interpreter, before the launcher installs its own (catch_early_signals, run_ranks)
FRESH_HANDLERS = {
    sig: signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL for sig in local.FORWARDED
}


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


def launch(argv: list[str] | None = None) -> int:
    """`scale *argv` in this process, its ranks forked from it (scale.launch.local's view of the subprocess module:
    its ranks started by start_rank)."""
    local.subprocess = types.SimpleNamespace(Popen=start_rank)
    return scale.cli.main(argv)


def launch_forked(argv: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`python tests/forked_ranks.py *argv` without its new interpreter: the launcher forked from this process (a
    pytest worker that has imported what the launcher imports, ~10 CPU s saved per launch), in the state a fresh
    interpreter starts in (environment, signal handlers, warning filters, stdout and stderr to files of its own);
    stdout and stderr come back as subprocess.run(capture_output=True, text=True) returns them."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_launcher(argv, env, out.fileno(), err.fileno())  # never returns
        deadline = time.monotonic() + timeout
        while not (done := os.waitpid(pid, os.WNOHANG))[0]:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)  # as subprocess.run does; the ranks follow (parent-death signal)
                os.waitpid(pid, 0)
                raise subprocess.TimeoutExpired([sys.argv[0], *argv], timeout)
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        text = (out.read().decode(errors="replace"), err.read().decode(errors="replace"))
        return subprocess.CompletedProcess(argv, os.waitstatus_to_exitcode(done[1]), *text)


def _run_launcher(argv: list[str], env: dict, out: int, err: int) -> None:
    code = 1
    try:
        os.setpgid(0, 0)  # the parent's process group is pytest's: a signal to the run's group must not reach it
        for sig, handler in {**FRESH_HANDLERS, signal.SIGALRM: signal.SIG_DFL}.items():  # pytest-timeout's SIGALRM
            signal.signal(sig, handler)
        devnull = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((devnull, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
        sys.stdin = open(0, closefd=False)
        sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False)
        sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(env)
        warnings.resetwarnings()  # pytest's filters; the environment's, as a new interpreter reads them
        for option in filter(None, env.get("PYTHONWARNINGS", "").split(",")):
            warnings.simplefilter(option.split(":")[0])  # type: ignore[arg-type]
        sys.argv = [__file__, *argv]
        code = launch(argv)
    except SystemExit as stop:  # as the interpreter reports it
        code = stop.code if isinstance(stop.code, int) else stop.code is not None
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))


if __name__ == "__main__":
    sys.exit(launch())
