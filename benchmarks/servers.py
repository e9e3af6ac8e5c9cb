"""Processes the suite starts for itself: a private redis-server, and HTTP servers.

Each binds 127.0.0.1 on a free port, is polled until it answers (with a deadline), and is
stopped by its owner (``with`` block) and, as a last resort, at interpreter exit: killed with
its process group and its temporary directory removed (``python -m benchmarks`` turns SIGINT
and SIGTERM into an exception, so both paths run; see ``cli.interruptible``).
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

import redis

__all__ = ["HttpServer", "RedisServer", "ServerError", "free_port"]

HOST = "127.0.0.1"
_alive: set[_Process] = set()


class ServerError(RuntimeError):
    """A server process did not start or did not answer in time."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_alive):
        with contextlib.suppress(OSError):
            os.killpg(process.proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            process.proc.wait(5)
        shutil.rmtree(process.dir, ignore_errors=True)
        _alive.discard(process)


def _poll(ready: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + 15.0
    delay = 0.005
    while True:
        if proc.poll() is not None:
            raise ServerError(f"{what} exited with code {proc.returncode}:\n{_tail(log)}")
        with contextlib.suppress(OSError, redis.RedisError, http.client.HTTPException):
            if ready():
                return
        if time.monotonic() > deadline:
            raise ServerError(f"{what} did not answer within 15 s:\n{_tail(log)}")
        time.sleep(delay)  # polling a condition with a deadline, not waiting and hoping
        delay = min(delay * 1.5, 0.1)


def _tail(log: Path) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    except OSError:
        return "<no log>"


class _Process:
    """A subprocess in its own session, logging to a temporary directory."""

    def __init__(self, command: Sequence[str], what: str, env: dict[str, str] | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="idemkey-bench-"))
        self.log = self.dir / "server.log"
        self.what = what
        try:
            with self.log.open("ab") as log:
                self.proc = subprocess.Popen(
                    list(command),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.dir,
                    env=env,
                    start_new_session=True,
                )
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        _alive.add(self)

    def stop(self) -> None:
        proc = self.proc
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        _alive.discard(self)  # last: interrupted before here, the exit hook finishes the job


class RedisServer:
    """A private ``redis-server`` with nothing on disk (``--save "" --appendonly no``)."""

    def __init__(self, executable: str | None = None) -> None:
        exe = executable or shutil.which("redis-server")
        if exe is None:
            raise ServerError("redis-server is not on PATH: pass --redis-url")
        self.port = free_port()
        self.url = f"redis://{HOST}:{self.port}/0"
        command = [exe, "--bind", HOST, "--port", str(self.port), "--save", "",
                   "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no"]  # fmt: skip
        self._process = _Process(command, f"redis-server on port {self.port}")
        probe = redis.Redis(host=HOST, port=self.port, socket_timeout=0.5)
        try:
            _poll(lambda: bool(probe.ping()), self._process.proc, self._process.what,
                  self._process.log)  # fmt: skip
        except BaseException:
            self._process.stop()
            raise
        finally:
            probe.close()

    def close(self) -> None:
        self._process.stop()

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@contextlib.contextmanager
def redis_url(url: str | None) -> Iterator[str]:
    """``url``, or the URL of a private :class:`RedisServer` started here and stopped on exit
    (what ``--redis-url`` left out means). Raises :class:`ServerError` when none can start."""
    if url is not None:
        yield url
        return
    with RedisServer() as server:
        yield server.url


class HttpServer:
    """gunicorn or uvicorn serving an app factory on a free port, one worker.

    gunicorn runs the ``gthread`` worker with one thread, because its ``sync`` worker closes
    every connection and a new TCP handshake per request would drown the difference measured.
    """

    def __init__(self, kind: str, app: str, env: dict[str, str]) -> None:
        self.port = free_port()
        python = sys.executable
        if kind == "gunicorn":
            command = [python, "-m", "gunicorn", "--bind", f"{HOST}:{self.port}", "--workers",
                       "1", "--worker-class", "gthread", "--threads", "1", "--keep-alive", "30",
                       "--log-level", "warning", app]  # fmt: skip
        elif kind == "uvicorn":
            command = [python, "-m", "uvicorn", "--host", HOST, "--port", str(self.port),
                       "--log-level", "warning", "--no-access-log", "--lifespan", "off",
                       "--factory", app]  # fmt: skip
        else:
            raise ValueError(kind)
        full_env = dict(os.environ)
        full_env.update(env)
        # The app modules live in this repository's benchmarks/ package.
        root = str(Path(__file__).resolve().parent.parent)
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (root, full_env.get("PYTHONPATH", "")) if p
        )
        self._process = _Process(command, f"{kind} on port {self.port}", full_env)

        def ready() -> bool:
            conn = http.client.HTTPConnection(HOST, self.port, timeout=1)
            try:
                conn.request("GET", "/health")
                return conn.getresponse().status == 200
            finally:
                conn.close()

        try:
            _poll(ready, self._process.proc, self._process.what, self._process.log)
        except BaseException:
            self._process.stop()
            raise

    def close(self) -> None:
        self._process.stop()
