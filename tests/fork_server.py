"""A preloaded fork server for the end-to-end tests' launches of `python tests/forked_ranks.py ARGS`.

Each such launch used to exec a new interpreter that spent most of its CPU time importing torch, timm and scale
before its ranks were forked from it. The server is one interpreter per pytest worker, started at its first launch,
that imports all that once (PRELOAD) and never runs a step or starts a thread (a fork beside autograd's or any other
thread may inherit a lock that thread holds: the reason the launcher is not forked from the pytest worker itself,
which has run backward passes). For each launch it forks a child that becomes what `python tests/forked_ranks.py
ARGS` would be: the request's arguments, environment, working directory, stdin/stdout/stderr (passed over a Unix
socket), warning filters and fault handler, in the server's process group (an exec'd launcher shares the pytest
worker's, as the server does), with the signal handlers of a fresh interpreter (the server installs none); the
script then runs as `__main__` and the child exits through the interpreter's own exit (atexit handlers included).

`run` and `Popen` take the command the tests used to exec, `[sys.executable, FORKED_RANKS, *ARGS]`, and give what
subprocess gives: the exit status as the exec'd process would report it (negative for a signal), the output, a
timeout that kills the launcher (its ranks follow by their parent-death signal). A launch whose environment differs
from the server's in a variable read once at start-up (STARTUP) is exec'd, as before. A server that dies fails the
launch with its log, never hangs it; it exits with the pytest worker (parent-death signal, end of its socket)."""

import ctypes
import faulthandler
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
FORKED_RANKS = HERE / "forked_ranks.py"

# What the server imports once: the launcher's (`scale train|eval|bench` and the recipe checks) and a DINO rank's
# on DDP or FSDP2 (loop, engines, method, backbone, TensorBoard). DeepSpeed is left to its ranks: its import logs to
# stderr and reads its own environment variables. A name that no longer imports costs speed, not correctness: the
# server reports it and test_fork_server fails on it.
PRELOAD = (
    "scale.cli",
    "scale.commands.train",
    "scale.commands.eval",
    "scale.commands.bench",
    "scale.loop.train",
    "scale.engine.torch_engine",
    "scale.engine.fsdp",
    "scale.methods.dino",
    "scale.models.vit",
    "torch.utils.tensorboard",
)
# Environment variables read once when an interpreter, libgomp, MKL or the dynamic loader start, or when a preloaded
# module is imported (torch, triton, huggingface_hub's constants, scale.launch.local's SCALE_STOP_GRACE_S): a forked launcher cannot take a new value of these,
# so a launch that sets another value than the server's is exec'd. The two PYTHON* ones below are applied per launch.
# Not KMP_* (Intel's OpenMP, which torch's wheels do not load): scikit-learn's import sets two of them mid-session.
STARTUP = ("PYTHON", "OMP_", "MKL_", "LD_", "TORCH", "TRITON", "HF_", "SCALE_STOP_GRACE_S")
PER_LAUNCH = ("PYTHONWARNINGS", "PYTHONFAULTHANDLER")
START_TIMEOUT_S = 600  # the server's imports: ~15 s on an idle machine, minutes on a loaded 2-core one
REPLY_TIMEOUT_S = 120  # a fork and a reply of its pid


# ---------------------------------------------------------------------------------------------------- the server


def _serve(control: socket.socket) -> tuple[dict, list[int]]:
    """Fork a launcher for each request on `control` and report its pid, then its exit status, on the request's
    own socket. Returns only in a forked launcher: its request and stdin/stdout/stderr; exits when the client has
    gone (its end of `control` closed)."""
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, reply socket)
    while True:
        ready, _, _ = select.select([control, *running], [], [])
        for item in ready:
            if item is not control:
                pid, reply = running.pop(item)
                os.close(item)
                _send(reply, os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
                reply.close()
                continue
            message, fds, flags, _ = socket.recv_fds(control, 1 << 22, 4)
            if not message:
                sys.exit(0)
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != 4:
                raise RuntimeError(f"fork server: a truncated request ({len(message)} bytes, {len(fds)} fds)")
            *stdio, reply_fd = fds
            reply = socket.socket(fileno=reply_fd)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the launcher keeps none of the server's sockets: the client sees EOF if the server dies
                for pidfd, (_, other) in running.items():
                    os.close(pidfd)
                    other.close()
                control.close()
                reply.close()
                return json.loads(message), stdio
            for fd in stdio:
                os.close(fd)
            running[os.pidfd_open(pid)] = (pid, reply)
            _send(reply, pid)


def _send(reply: socket.socket, number: int) -> None:
    try:
        reply.sendall(f"{number}\n".encode())
    except OSError:  # the client stopped waiting (it killed the launch and went on): the launch is still reaped
        pass


def _become_launcher(request: dict, stdio: list[int], defaults: list, added: list) -> None:
    """In the forked child: the state `python FORKED_RANKS ARGS` starts in, then that script run as __main__.
    `defaults`: a fresh interpreter's warning filters; `added`: those the preloaded libraries added."""
    for fd, target in zip(stdio, (0, 1, 2)):
        os.dup2(fd, target)
        os.close(fd)
    # buffered as the interpreter would open them for these files (line by line for a terminal only)
    sys.stdout.reconfigure(line_buffering=os.isatty(1))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # the libraries' filters first, then PYTHONWARNINGS', then the defaults: the order in an interpreter started
    # with this PYTHONWARNINGS that then imported the same libraries
    sys.warnoptions[:] = [o for o in os.environ.get("PYTHONWARNINGS", "").split(",") if o]
    warnings.filters[:] = defaults
    warnings._processoptions(sys.warnoptions)
    warnings.filters[:0] = added
    warnings._filters_mutated()
    if os.environ.get("PYTHONFAULTHANDLER"):
        faulthandler.enable()
    else:
        faulthandler.disable()
    if "numpy" in sys.modules:  # numpy's global generator is seeded at import: each launch would get the server's
        sys.modules["numpy"].random.seed()
    sys.argv = [str(FORKED_RANKS), *request["argv"]]
    sys.path.insert(0, str(HERE))  # the script's folder first on the path, as the interpreter puts it
    runpy.run_path(str(FORKED_RANKS), run_name="__main__")


def _server_main(control_fd: int, parent: int) -> None:
    # SIGKILL when the pytest worker dies, even by SIGKILL (Linux); a parent gone before prctl: exit now
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        sys.exit(1)
    control = socket.socket(fileno=control_fd)
    defaults = list(warnings.filters)  # the server starts without PYTHONWARNINGS: a fresh interpreter's filters
    missing = []
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError as error:
            missing.append(f"{name}: {error}")
    added = warnings.filters[: len(warnings.filters) - len(defaults)]  # filterwarnings() puts new ones first
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:  # a fork beside another thread may inherit a lock it holds
        sys.exit(f"fork server: {threads} threads after the imports, forking is unsafe")
    # the start-up variables the preloaded imports set themselves (torch._inductor's TORCHINDUCTOR_CACHE_DIR): a
    # launch whose environment holds the same values gets what its own imports would have set
    set_by_imports = {k: v for k, v in os.environ.items() if k.startswith(STARTUP)}
    control.send(json.dumps({"missing": missing, "set_by_imports": set_by_imports}).encode())
    request, stdio = _serve(control)
    _become_launcher(request, stdio, defaults, added)


# ---------------------------------------------------------------------------------------------------- the client


class ServerError(RuntimeError):
    """The fork server died or did not answer: the launch is lost (its log is in the message)."""


class Server:
    """The client's end of one server process."""

    def __init__(self, env: dict):
        self.env = {k: v for k, v in env.items() if k != "PYTHONWARNINGS"}  # see _become_launcher's filters
        self.log = tempfile.NamedTemporaryFile(prefix="fork_server_", suffix=".log", delete=False)
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cmd = [sys.executable, str(Path(__file__)), str(theirs.fileno()), str(os.getpid())]
        self.proc = subprocess.Popen(
            cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, pass_fds=[theirs.fileno()]
        )
        theirs.close()
        if not select.select([self.control], [], [], START_TIMEOUT_S)[0]:
            self.stop()
            raise ServerError(f"fork server: not ready after {START_TIMEOUT_S} s{self.output()}")
        hello = self.control.recv(1 << 16)
        if not hello:
            raise ServerError(f"fork server: exited at start with status {self.proc.wait()}{self.output()}")
        hello = json.loads(hello)
        self.missing = hello["missing"]
        self.set_by_imports = {k: v for k, v in hello["set_by_imports"].items() if k not in self.env}

    def differences(self, env: dict) -> list[str]:
        """The STARTUP variables whose value in `env` a launcher forked from this server could not have."""
        return sorted(
            k
            for k in {*env, *self.env}
            if k.startswith(STARTUP)
            and k not in PER_LAUNCH
            and env.get(k) != self.env.get(k)
            and env.get(k) != self.set_by_imports.get(k)  # unset in the server's launch, then set by an import
        )

    def fork(self, argv: list[str], env: dict, cwd: str, stdio: list[int]) -> tuple[int, socket.socket]:
        """A launcher of `FORKED_RANKS *argv`: its pid and the socket its exit status will come on."""
        ours, theirs = socket.socketpair()
        try:
            request = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
            socket.send_fds(self.control, [request], [*stdio, theirs.fileno()])
        except OSError as error:
            raise ServerError(f"fork server: gone ({error}){self.output()}") from None
        finally:
            theirs.close()
        reply = Reply(ours, self)
        pid = reply.line(REPLY_TIMEOUT_S)
        if pid is None:
            raise ServerError(f"fork server: no answer in {REPLY_TIMEOUT_S} s{self.output()}")
        return int(pid), reply

    def output(self) -> str:
        text = Path(self.log.name).read_text(errors="replace")[-3000:]
        return f"; its log ({self.log.name}):\n{text}" if text else ""

    def stop(self) -> None:
        self.control.close()  # the server exits at the end of its socket
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


class Reply:
    """The lines the server sends about one launch: its pid, then its exit status."""

    def __init__(self, sock: socket.socket, server: Server):
        self.sock, self.server, self.buffer = sock, server, b""

    def line(self, timeout: float | None) -> str | None:
        """The next line, or None if none came within `timeout` seconds."""
        while b"\n" not in self.buffer:
            if not select.select([self.sock], [], [], timeout)[0]:
                return None
            data = self.sock.recv(64)
            if not data:
                raise ServerError(f"fork server: died with a launch running{self.server.output()}")
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()


class Popen:
    """The part of subprocess.Popen the tests use (pid, returncode, poll, wait, send_signal, terminate, kill,
    communicate) for a launcher forked by the server. PIPE is a temporary file, read by communicate() once the
    launcher has exited: nothing reads it while it runs, so no output can fill a pipe and block it."""

    def __init__(self, args, *, env=None, cwd=None, stdin=None, stdout=None, stderr=None, text=False):
        self.args, self.text, self.returncode = args, text, None
        env = dict(os.environ if env is None else env)
        self.captured = {}  # name -> the temporary file of a PIPE
        opened = []
        fds = []
        for name, how, fd in (("stdin", stdin, 0), ("stdout", stdout, 1), ("stderr", stderr, 2)):
            if how == subprocess.PIPE:
                self.captured[name] = tempfile.TemporaryFile()
                fd = self.captured[name].fileno()
            elif how == subprocess.DEVNULL:
                opened.append(os.open(os.devnull, os.O_RDWR))
                fd = opened[-1]
            elif how == subprocess.STDOUT:
                fd = fds[1]
            elif how is not None:
                fd = how if isinstance(how, int) else how.fileno()
            fds.append(fd)
        try:
            self.pid, self._reply = _server(env).fork(list(map(str, args[2:])), env, os.fspath(cwd or os.getcwd()), fds)
        finally:
            for fd in opened:
                os.close(fd)

    def poll(self) -> int | None:
        return self._status(0)

    def wait(self, timeout: float | None = None) -> int:
        if self._status(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            line = self._reply.line(timeout)
            if line is not None:
                self.returncode = int(line)
                self._reply.sock.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as subprocess: never a signal to a pid the launcher no longer holds
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input=None, timeout: float | None = None) -> tuple:
        if input is not None:
            raise NotImplementedError("fork_server.Popen: no input (no test sends any)")
        self.wait(timeout)
        return self._read("stdout"), self._read("stderr")

    def _read(self, name: str):
        file = self.captured.pop(name, None)
        if file is None:
            return None
        file.seek(0)
        data = file.read()
        file.close()
        if not self.text:
            return data
        # as subprocess decodes text mode output: the locale's encoding, universal newlines
        return data.decode(_encoding()).replace("\r\n", "\n").replace("\r", "\n")


def _encoding() -> str:
    import locale

    return locale.getpreferredencoding(False)


def run(args, *, env=None, cwd=None, timeout=None, capture_output=False, text=False) -> subprocess.CompletedProcess:
    """subprocess.run(args, ...) for args = [sys.executable, FORKED_RANKS, *ARGS]: the launcher forked by the server,
    or exec'd where its environment needs a new interpreter (Server.differences)."""
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE} if capture_output else {}
    env = dict(os.environ if env is None else env)
    if not _forkable(args, env):
        return subprocess.run(args, env=env, cwd=cwd, timeout=timeout, text=text, **pipes)
    proc = Popen(args, env=env, cwd=cwd, text=text, **pipes)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as expired:  # as subprocess.run: the launcher killed, its output kept
        proc.kill()
        expired.output, expired.stderr = proc.communicate()
        raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def popen(args, *, env=None, **kwargs):
    """subprocess.Popen(args, ...) for args = [sys.executable, FORKED_RANKS, *ARGS], as `run` chooses."""
    env = dict(os.environ if env is None else env)
    if not _forkable(args, env):
        return subprocess.Popen(args, env=env, **kwargs)
    return Popen(args, env=env, **kwargs)


def _forkable(args, env: dict) -> bool:
    if list(map(str, args[:2])) != [sys.executable, str(FORKED_RANKS)]:
        raise ValueError(f"fork_server launches `python {FORKED_RANKS} ARGS`, not {args[:2]}")
    differences = _server(env).differences(env)
    if differences:  # correct, but the launch pays its imports again: say so in pytest's warnings summary
        warnings.warn(f"fork_server: exec'd, its environment differs in {differences} from the server's", stacklevel=3)
    return not differences


_current: Server | None = None


def _server(env: dict) -> Server:
    """The worker's server, started at its first launch (with that launch's environment), or again if it died."""
    global _current
    if _current is None or _current.proc.poll() is not None:
        if _current is not None:
            raise ServerError(f"fork server: exited with status {_current.proc.returncode}{_current.output()}")
        _current = Server(env)
    return _current


def stop() -> None:
    """Stop the worker's server (the session's end)."""
    global _current
    if _current is not None:
        _current.stop()
        _current = None


if __name__ == "__main__":
    sys.path.pop(0)  # this folder (tests/) on the path would shadow libraries by its sub-folders' names
    _server_main(int(sys.argv[1]), int(sys.argv[2]))
