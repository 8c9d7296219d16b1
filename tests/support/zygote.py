"""Test scripts started as forks of a process that has already imported jax, orbax and ciclo.

The fault tests start about 80 training scripts, and each fresh interpreter spent
about 1.8 s of CPU importing jax (ml_dtypes' registrations most of it), orbax and
ciclo before its first line: most of the `faults` session's CPU. A zygote imports
them once; each script is then a `fork()` of it that runs as `python script.py
ARGS` (or `python -c CODE ARGS`) would: `__main__`, `sys.argv`, `sys.path[0]`, its
own environment and working directory, stdin from /dev/null, atexit handlers and
exit code at its end. The test holds a `subprocess.Popen`-like handle: its pid
takes real signals, its exit code is the one `waitpid` gives, its stdout and
stderr are pipes or files as asked.

No jax backend exists in the zygote when it forks (JAX warns of a fork after one),
so each script reads `XLA_FLAGS` (its device count) when it first uses jax. What
`import jax` reads from the environment (`_SAME`) is the zygote's, so scripts whose
environments differ there get different zygotes. What must be a fresh interpreter
stays one: the import checks, the pid-1 container tests (through `unshare`),
scripts that configure logging before importing jax.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import types
from collections.abc import Mapping, Sequence
from typing import IO, Any

PRELOAD = ("numpy", "jax", "jax.numpy", "optax", "orbax.checkpoint", "ciclo", "flax.linen", "mlflow", "wandb")
"""What the zygote imports, where installed: what the fault scripts import before their first step."""

_SAME = ("JAX_", "XLA_PYTHON", "TF_", "PYTHON", "LD_", "OPENBLAS", "OMP_", "MKL_", "TPU_", "CUDA")
"""Environment variables read at import: scripts that differ in them are forked from different zygotes."""


def _read_at_import(env: Mapping[str, str]) -> dict[str, str]:
    return {key: value for key, value in env.items() if key.startswith(_SAME)}


def _serve(fd: int, preload: Sequence[str]) -> None:
    """The zygote's loop: forks a script per request, tells the test each child's pid and exit code."""
    sock = socket.socket(fileno=fd)
    for module in preload:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    sock.send(b"{}")  # ready
    children: set[int] = set()
    while True:
        if select.select([sock], [], [], 0.02)[0]:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
            if not message:  # the test process ended
                return
            request = json.loads(message)
            pid = os.fork()
            if pid == 0:
                sock.close()
                _become(request, fds)  # raises SystemExit: the interpreter ends as a script's does
            for passed in fds:
                os.close(passed)
            children.add(pid)
            sock.send(json.dumps({"started": pid}).encode())
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            sock.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: the script's streams, environment, arguments and signals; then the script."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for passed in fds:
        os.close(passed)
    for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if "numpy" in sys.modules:  # a fresh interpreter's global numpy generator is seeded anew (`random` is)
        sys.modules["numpy"].random.seed()
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = request["argv"]
    if argv[0] == "-c":  # python -c CODE ARGS: `sys.argv[0]` is "-c", `sys.path[0]` the working directory
        sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    else:
        sys.argv, sys.path[0] = list(argv), os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
    raise SystemExit(0)


class Forked:
    """A script forked by a `Zygote`: the part of `subprocess.Popen` the fault tests use."""

    def __init__(
        self, zygote: Zygote, args: list[str], pid: int, stdout: IO[str] | None, stderr: IO[str] | None
    ):
        self.args, self.pid, self.stdout, self.stderr = args, pid, stdout, stderr
        self.returncode: int | None = None
        self._zygote = zygote

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid, timeout=timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Reads the piped streams to their end and waits, as `Popen.communicate`."""
        read: dict[str, str] = {}

        def read_all(name: str, stream: IO[str]) -> None:
            read[name] = stream.read()

        streams = {"stdout": self.stdout, "stderr": self.stderr}
        readers = [
            threading.Thread(target=read_all, args=(name, stream), daemon=True)
            for name, stream in streams.items()
            if stream is not None and not stream.closed
        ]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(timeout)
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(timeout)
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        return read.get("stdout"), read.get("stderr")

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Zygote:
    """A process that has imported `PRELOAD`, started with `env`, forking scripts for this process."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = f"from support import zygote; zygote._serve({theirs.fileno()}, {list(PRELOAD)!r})"
        self._process = subprocess.Popen(
            [sys.executable, "-c", code],
            env=self.env,
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        theirs.close()
        self._exits: dict[int, int] = {}
        self._started: list[int] = []
        self._changed = threading.Condition()
        self._lock = threading.Lock()
        if not self._sock.recv(1 << 16):
            raise RuntimeError(f"the zygote ended before it was ready (exit {self._process.wait()})")
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        while message := self._sock.recv(1 << 16):
            event = json.loads(message)
            with self._changed:
                if "started" in event:
                    self._started.append(event["started"])
                else:
                    self._exits[event["exited"]] = event["code"]
                self._changed.notify_all()
        with self._changed:  # the zygote is gone: so are the children it had not reported
            self._exits.setdefault(-1, -1)
            self._changed.notify_all()

    def start(
        self, argv: Sequence[str], env: Mapping[str, str], stdout: Any = None, stderr: Any = None
    ) -> Forked:
        """Forks `python argv...`; `stdout`/`stderr`: `subprocess.PIPE`, `DEVNULL`, `STDOUT` or a file."""
        closing: list[int] = []

        def target(spec: Any, default: int) -> tuple[int, IO[str] | None]:
            if spec == subprocess.PIPE:
                read, write = os.pipe()
                closing.append(write)
                return write, open(read, encoding="utf-8")
            if spec == subprocess.DEVNULL:
                closing.append(null := os.open(os.devnull, os.O_WRONLY))
                return null, None
            return (default if spec is None else spec.fileno()), None

        out, out_pipe = target(stdout, 1)
        err, err_pipe = (out, None) if stderr == subprocess.STDOUT else target(stderr, 2)
        request = {"argv": list(argv), "env": dict(env), "cwd": os.getcwd()}
        with self._lock:
            socket.send_fds(self._sock, [json.dumps(request).encode()], [out, err])
            for fd in closing:
                os.close(fd)
            with self._changed:
                self._changed.wait_for(lambda: self._started or -1 in self._exits)
                if not self._started:
                    raise RuntimeError("the zygote ended")
                pid = self._started.pop(0)
        return Forked(self, list(argv), pid, out_pipe, err_pipe)

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        """`pid`'s exit code once it has ended, waiting up to `timeout` seconds; None: still running."""
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or -1 in self._exits, timeout)
            if pid not in self._exits and -1 in self._exits:
                raise RuntimeError(f"the zygote ended before it could report how process {pid} ended")
            return self._exits.get(pid)

    def close(self) -> None:
        """Ends the zygote (its children go on); the listening thread sees the end of its socket."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._process.wait()
        self._sock.close()


Process = subprocess.Popen[str] | Forked
"""What `popen` returns."""

_zygotes: dict[str, Zygote] = {}
"""This process's zygotes, by what their scripts read at import (`_SAME`): one in most test processes."""


def popen(
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    stdout: Any = None,
    stderr: Any = None,
    fresh: bool = False,
) -> Process:
    """`subprocess.Popen(command, ..., text=True)`, forked from a zygote where `command` is this Python
    running a script or `-c` code; a fresh interpreter where asked (`fresh`) or where it is not
    (`unshare ...`, `python -W error ...`)."""
    forkable = command[0] == sys.executable and (command[1] == "-c" or command[1].endswith(".py"))
    if fresh or not forkable:
        return subprocess.Popen(list(command), env=dict(env), stdout=stdout, stderr=stderr, text=True)
    key = json.dumps(_read_at_import(env), sort_keys=True)
    zygote = _zygotes.get(key)
    if zygote is None:
        zygote = _zygotes[key] = Zygote({**env, "XLA_FLAGS": ""})
        atexit.register(zygote.close)
    return zygote.start(command[1:], env, stdout, stderr)


def run(
    command: Sequence[str], *, env: Mapping[str, str], timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)` through `popen`."""
    process = popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    return subprocess.CompletedProcess(list(command), process.wait(), stdout, stderr)
