"""The package's layout: every public name of 0.2 still imports, no import cycle, no framework.

``PUBLIC_NAMES_0_2`` was generated from main before idemkey/http/ existed (every name in the
``__all__`` of each public module, underscore names left out), so a move that drops or renames
a public import fails here.
``test_no_import_cycle`` reads every module of the package with ``ast`` and draws an edge for
each import at any depth: at module level, under ``if TYPE_CHECKING:`` (and any other ``if`` or
``try``) and inside functions. A cycle there is one a type checker, a doc tool or a future
runtime import trips on, and one moved into a function is still a knot for its reader.
``from package import name`` is an edge to ``package.name`` when that is a module, else to
``package``.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "idemkey"

PUBLIC_NAMES_0_2: dict[str, tuple[str, ...]] = {
    "idemkey": (
        "AsyncRedisStore",
        "Call",
        "ConfigurationError",
        "Event",
        "IdemkeyError",
        "InvalidKeyError",
        "KeyReuseError",
        "LeaseLostError",
        "NoResultError",
        "Policy",
        "RecordFormatError",
        "RedisStore",
        "Replicas",
        "RequestInFlightError",
        "ResultNotStorableError",
        "StepNotStorableError",
        "StoreError",
        "StoredResponse",
        "UsageError",
        "aguard",
        "current_call",
        "guard",
        "idempotent",
    ),
    "idemkey.http": (
        "BODY_NOT_KEPT_HEADER",
        "BodyCopy",
        "Complete",
        "Exchange",
        "Headers",
        "Problem",
        "REPLAYED_HEADER",
        "Release",
        "Request",
        "Response",
        "begin",
        "problem",
        "render",
    ),
    "idemkey.routes": (
        "KnownRoute",
        "ROUTE_UNKNOWN",
        "Route",
        "RouteTable",
        "Routes",
        "Selected",
        "exempt",
        "route",
    ),
    "idemkey.errors": (
        "ConfigurationError",
        "IdemkeyError",
        "InvalidKeyError",
        "KeyReuseError",
        "LeaseLostError",
        "NoResultError",
        "ProtocolError",
        "RecordFormatError",
        "RequestInFlightError",
        "ResultNotStorableError",
        "StepNotStorableError",
        "StoreError",
        "UsageError",
    ),
    "idemkey.events": (
        "ALWAYS_LOGGED",
        "DEBUG",
        "Event",
        "EventKind",
        "RECORD_LOST_DETAIL",
        "TAKEN_OVER_DETAIL",
        "emit",
        "enabled_memo",
        "logger",
        "quiet",
        "report",
    ),
    "idemkey.policy": (
        "DEFAULT_COMPRESS_AT",
        "DEFAULT_HEADER_DENYLIST",
        "NEVER_BEGAN_STATUSES",
        "Policy",
        "Replicas",
        "credential_scope",
    ),
    "idemkey.records": (
        "Claimed",
        "Decision",
        "GUARD_METHOD",
        "InFlight",
        "MAX_KEY_LENGTH",
        "Mismatch",
        "Record",
        "Replay",
        "StoredResponse",
        "decode_response",
        "decode_value",
        "encode_response",
        "encode_value",
        "new_owner",
        "parse_key",
        "payload_fingerprint",
        "record_for",
        "request_fingerprint",
    ),
    "idemkey.testing": (
        "disabled",
        "fake_async_store",
        "fake_redis",
        "fake_store",
    ),
    "idemkey.guard": (
        "AsyncGuard",
        "Call",
        "GUARD_METHOD",
        "Guard",
        "aguard",
        "current_call",
        "guard",
        "idempotent",
    ),
    "idemkey.store": (
        "AsyncRedisStore",
        "Cancelled",
        "Forgotten",
        "RedisStore",
        "SCRIPTS",
        "SCRIPT_NAMES",
        "detach",
        "server_warnings",
        "uncancellable",
    ),
    "idemkey.client": (
        "AsyncClient",
        "AsyncIdempotentTransport",
        "Client",
        "ClientError",
        "ClientStateError",
        "Done",
        "GiveUp",
        "IdempotentResponse",
        "IdempotentTransport",
        "Operation",
        "Refused",
        "RefusedError",
        "RetriesExhaustedError",
        "Retry",
        "RetryEvent",
        "RetryHook",
        "RetryPolicy",
        "Schedule",
        "Step",
        "parse_retry_after",
    ),
    "idemkey.adapters.asgi": (
        "ASGIApp",
        "IdempotencyMiddleware",
        "Message",
        "Receive",
        "Scope",
        "Send",
    ),
    "idemkey.adapters.django": (
        "IdempotencyMiddleware",
        "idempotency_exempt",
        "idempotent",
    ),
    "idemkey.adapters.fastapi": (
        "Idempotency",
        "IdempotentRoute",
    ),
    "idemkey.adapters.flask": ("Idemkey",),
    "idemkey.adapters.starlette": ("Idempotency",),
    "idemkey.adapters.wsgi": (
        "DRAIN_SECONDS",
        "EnvironHeaders",
        "IdempotencyMiddleware",
    ),
    "idemkey.contrib": ("chain",),
    "idemkey.contrib.celery": (
        "IdempotentTask",
        "celery_key",
    ),
    "idemkey.contrib.otel": ("otel_hook",),
    "idemkey.contrib.prometheus": (
        "DEFAULT_BUCKETS",
        "prometheus_hook",
    ),
    "idemkey.contrib.sqlalchemy": (
        "AsyncEffects",
        "Effects",
        "afenced",
        "effects_table",
        "fenced",
    ),
}

FRAMEWORKS = (
    "celery", "django", "fastapi", "flask", "httpx", "opentelemetry", "prometheus_client",
    "sqlalchemy", "starlette", "werkzeug",
)  # fmt: skip


@pytest.mark.parametrize(
    ("module", "name"),
    [(module, name) for module, names in PUBLIC_NAMES_0_2.items() for name in names],
)
def test_every_public_name_of_0_2_still_imports_from_where_it_did(module: str, name: str) -> None:
    imported = importlib.import_module(module)
    assert hasattr(imported, name), f"from {module} import {name} no longer works"
    assert name in imported.__all__, f"{name} left {module}.__all__"


def test_importing_idemkey_imports_no_framework() -> None:
    code = (
        "import sys, idemkey, idemkey.http, idemkey.routes, idemkey.records, idemkey.testing\n"
        f"found = sorted(m for m in {FRAMEWORKS!r} if m in sys.modules)\n"
        "assert not found, found\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ["idemkey", *path.relative_to(PACKAGE).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _every_import(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import of the module, at any depth: inside functions too (an import moved into a
    function unties a knot only for the interpreter, not for the reader)."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at any depth, TYPE_CHECKING included."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _every_import(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in modules else base)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        path.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, path)
        path.pop()
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    return cycles


def test_the_graph_sees_type_checking_imports() -> None:
    graph = import_graph()
    assert "idemkey.policy" in graph["idemkey.http._exchange"]  # only under TYPE_CHECKING
    assert "idemkey.http._messages" in graph["idemkey.http._scope"]  # likewise
    # Inside a function: the heartbeat finds the glide facade at call time.
    assert "idemkey.store._glide" in graph["idemkey.store._concurrency._async_heartbeat"]
    assert find_cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]


def test_no_import_cycle() -> None:
    assert find_cycles(import_graph()) == []


def test_the_package_root_holds_at_most_ten_modules() -> None:
    # __init__ is the package and __main__ only the ``python -m idemkey`` entry: not counted.
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(modules) <= 10, modules


def test_no_underscore_name_in_any_all() -> None:
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                names = [e.value for e in getattr(node.value, "elts", [])]
                private = [n for n in names if isinstance(n, str) and n.startswith("_")]
                assert not private, f"{path.relative_to(PACKAGE.parent)}: {private}"


def test_the_names_say_what_they_name() -> None:
    import idemkey
    from idemkey.errors import ProtocolError
    from idemkey.records import record_for

    assert idemkey.ProtocolError is ProtocolError
    error = ProtocolError("done", "finish")
    assert (error.state, error.transition, error.step) == ("done", "finish", "finish")
    record = record_for("idemkey", "scope", "POST", "/charges", "k1")
    # 0.2's lock name is built when asked, not with every record (issue 40).
    assert record._fields == ("digest", "record_key")
    assert record.lock_key == record.record_key + ":lock"
    assert (record.key, record.lock) == (record.record_key, record.lock_key)  # the 0.2 names


def test_no_module_is_over_400_lines() -> None:
    """A module reads in one sitting (docs/design.md#layout); generated twins count too."""
    long = {
        path.relative_to(PACKAGE).as_posix(): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 400
    }
    assert long == {}
