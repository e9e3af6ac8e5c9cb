"""One record, as ``inspect`` and ``forget`` name it on the command line, read and shown."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import IO, Any, Final

from .._codec import StoredResponse, decode_response, decode_value
from .._core import (
    OWNER_TAG_LENGTH,
    Record,
    is_digest,
    parse_key,
    record_for,
    record_from_digest,
    record_state,
)
from .._core._origin import ORIGIN_FIELDS, decode_origin, escape_key, printable_text
from .._core._stored import stored_int
from ..errors import InvalidKeyError, RecordFormatError
from ..guard import GUARD_METHOD
from ..guard._failures import is_failure, read_failure
from ..http._messages import Headers, Request
from ..http._scope import NO_CREDENTIALS, credential_scope
from ..store.diagnostics import _text as text
from ..store.status import lease_left_ms, server_ms
from ._base import CliError
from .readable import PREVIEW_BYTES, duration, preview, shorten, shown, utc_time

__all__ = [
    "NOT_SEARCHABLE",
    "Candidate",
    "RecordView",
    "add_record_options",
    "names_one_record",
    "read_record",
    "record_candidates",
    "show_record",
]


def add_record_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key", nargs="?", metavar="KEY", help="the Idempotency-Key value")
    parser.add_argument(
        "--scope",
        action="append",
        help="the tenant scope (Policy.scope's answer; repeat to try several; default: try the "
        "default scope of a request without credentials, and the empty scope)",
    )
    parser.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="a credential header the request carried (Authorization, Cookie, X-Api-Key...): "
        "try the default scope it gives",
    )
    parser.add_argument("--method", default="POST", help="HTTP method (default: POST)")
    parser.add_argument(
        "--route",
        action="append",
        help="route template, e.g. /charges (the path when the middleware knows no routes); "
        "repeat to try several; with --guard, an @idempotent function's name",
    )
    parser.add_argument("--guard", action="store_true", help="a guard()/@idempotent record")
    parser.add_argument("--digest", help="name the record by its digest (from logs, events)")


@dataclass(frozen=True)
class Candidate:
    """One name ``inspect`` and ``forget`` try: the record of (scope, method, route, key)."""

    record: Record
    scope: str = ""
    scope_note: str = ""  # how the scope is shown: where it came from
    method: str = ""
    route: str = ""

    def describe(self) -> str:
        route = f" {self.route}" if self.route else ""
        return f"scope {self.scope_note}, {self.method}{route}"


#: Said when no name tried holds a record: a record's name is a one-way digest.
NOT_SEARCHABLE: Final = (
    "a record's name is a digest of scope, method, route and key, so it cannot be looked up "
    "by key alone: give --scope (what Policy.scope returned), -H with the request's "
    "credential header (the default scope), --route (the route template, or the path), "
    "--method, --guard, or --digest from a log line or event"
)


def _scope_header(line: str) -> tuple[str, str]:
    name, sep, value = line.partition(":")
    if not sep or not name.strip():
        raise CliError(f"-H wants 'Name: value', got {line!r}", 2)
    return name.strip(), value.strip()


def _scopes(args: argparse.Namespace, *, guard: bool) -> list[tuple[str, str]]:
    """(scope, how it is shown) for each scope to try."""
    scopes = [(s, repr(s)) for s in args.scope or ()]
    if args.header:
        headers = [_scope_header(line) for line in args.header]
        request = Request("POST", "/", "", Headers(headers))
        names = ", ".join(name for name, _ in headers)
        scopes.append((credential_scope(request), f"<default scope of {names}>"))
    if not scopes:
        scopes.append(("", "'' (empty)"))
        if not guard:  # guard() records have the empty scope unless told otherwise
            note = "<default scope, no credentials>"
            scopes.insert(0, (NO_CREDENTIALS, note))
    return scopes


def names_one_record(args: argparse.Namespace) -> bool:
    """Whether the command line names one record outright (nothing left to try): a digest,
    ``--guard`` (its scope is empty unless told), or a scope with a route."""
    return bool(args.digest or args.guard or (args.route and (args.scope or args.header)))


def record_candidates(args: argparse.Namespace) -> list[Candidate]:
    """The records the command line may mean: one when it names every part, else each
    combination of the scopes and routes to try (see :data:`NOT_SEARCHABLE`)."""
    prefix = args.prefix
    if args.digest:
        digest = args.digest.strip().lower()
        if not is_digest(digest):
            raise CliError("--digest must be the 32 hex digits inside the record's braces", 2)
        if args.key is not None:
            raise CliError("give either KEY or --digest, not both", 2)
        return [Candidate(record_from_digest(prefix, digest), scope_note="?", method="?")]
    if args.key is None:
        raise CliError("give the idempotency KEY (or --digest D)", 2)
    if args.guard or not args.route:
        # guard() records: method GUARD, route "" (@idempotent: the function's name).
        return [
            Candidate(record_for(prefix, scope, GUARD_METHOD, route, args.key), scope, note,
                      GUARD_METHOD, route)
            for scope, note in _scopes(args, guard=True)
            for route in (args.route if args.guard and args.route else [""])
        ]  # fmt: skip
    try:
        # The header value as the client sent it: "abc" (sf-string) and abc name one record.
        key = parse_key(args.key)
    except InvalidKeyError as exc:
        raise CliError(f"not a valid Idempotency-Key: {exc.reason}", 2) from None
    method = args.method.upper()
    return [
        Candidate(record_for(prefix, scope, method, route, key), scope, note, method, route)
        for scope, note in _scopes(args, guard=False)
        for route in args.route
    ]


#: A view's state when the record's name holds a key of another type (forget.lua's too).
FOREIGN: Final = "foreign"


@dataclass
class RecordView:
    """What ``inspect`` shows of a record."""

    record: str
    digest: str
    exists: bool
    state: str = ""
    owner: str = ""
    fence: int | None = None
    lease_ms: int = -2
    ttl_ms: int = -2
    at: str = ""
    kind: str = ""  # "response", "result", "failure", or "" when nothing is stored
    status: int | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    body_size: int | None = None
    body_kept: bool | None = None
    preview: str = ""
    error: str = ""
    #: The finished steps (recovery points) a record in progress or released keeps.
    steps: list[str] = field(default_factory=list)
    #: Where it comes from and the client's key (escaped), from the origin the claim kept;
    #: "" when none was kept (docs/operators.md#what-records-keep).
    origin: str = ""
    client_key: str = ""
    #: An unreadable response's status line and header lines as stored, escaped and bounded.
    head: list[str] = field(default_factory=list)


def read_record(
    client: Any, record: Record, *, guard: bool | None = None, value: bool = True
) -> RecordView:
    """Read one record (hash, PTTLs, lease, server clock) in one pipeline and decode what it stores.

    ``guard``: True for a guard() record (msgpack value), False for an HTTP response, None to
    try the response format first (when only the digest is known). ``value=False`` leaves the
    stored value undecoded: ``forget`` and ``cancel`` need the state and the lease only, and an
    unreadable value must never keep an operator from removing its record (the remedy for it).
    """
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(record.record_key)
    pipe.pttl(record.record_key)
    pipe.hget(record.record_key, "lease")
    pipe.pttl(record.lock_key)  # a claim written by 0.2 keeps its lease there: remove in 0.4
    pipe.execute_command("TIME")
    # Errors as values: a key of another type at the record's name fails the hash reads
    # (WRONGTYPE), which is no Redis failure (exit 3) but what the operator came to see.
    fields, ttl_ms, deadline, legacy, now = pipe.execute(raise_on_error=False)
    for reply in (fields, ttl_ms, deadline, legacy, now):
        if isinstance(reply, Exception):
            kind = text(client.type(record.record_key))
            if kind in ("hash", "none"):
                raise reply  # as the pipeline would have raised it
            return RecordView(
                record.record_key, record.digest, True, FOREIGN, ttl_ms=ttl_ms,
                error=f"not an idemkey record (a {kind})",
            )  # fmt: skip
    lease_ms = lease_left_ms(deadline, legacy, server_ms(now))
    view = RecordView(
        record.record_key, record.digest, bool(fields), lease_ms=lease_ms, ttl_ms=ttl_ms
    )
    if not fields:
        return view
    get = {text(k): v for k, v in fields.items()}.get
    view.state = record_state({k.encode() if isinstance(k, str) else k: v
                               for k, v in fields.items()})  # fmt: skip
    view.owner = text(get("owner"))
    fp = get("fp")
    if view.state == "complete" and not view.owner and isinstance(fp, bytes):
        # A completed record keeps a 12-character tag of its owner after the fingerprint.
        view.owner = text(fp[-OWNER_TAG_LENGTH:])
    view.steps = sorted(name[2:] for name in map(text, fields) if name.startswith("s:"))
    view.fence = stored_int(text(get("fence")))
    # The last claim or completion: written by idemkey before 0.2 only; remove in 0.4.
    at = stored_int(text(get("at")))
    stamp = utc_time(at / 1000) if at is not None else None  # None: past what a date holds
    if stamp is not None:
        view.at = stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    origin = decode_origin([get(name) for name in ORIGIN_FIELDS])
    # Route and scope may come from a request (a path, a tenant header): printed escaped too.
    view.origin = f"{escape_key(origin.method)} {printable_text(origin.route)}".strip()
    if origin.scope:
        view.origin += f" [{printable_text(origin.scope)}]"
    view.client_key = origin.key + ("..." if origin.cut else "")
    stored = get("resp")
    if value and isinstance(stored, bytes) and stored:
        _decode_stored(view, stored, guard)
    return view


def _decode_stored(view: RecordView, stored: bytes, guard: bool | None) -> None:
    response: StoredResponse | None = None
    if guard is not True:
        try:
            response = decode_response(stored)
        except RecordFormatError as exc:
            if guard is False:
                view.error = str(exc)
                view.head = _raw_head(stored)
                return
    if response is not None:
        view.kind = "response"
        view.status = response.status
        view.headers = [(n, v) for n, v in response.headers]
        view.body_size = len(response.body)
        view.body_kept = response.body_kept
        view.preview = preview(response.body)
        return
    if is_failure(stored):  # a remembered failure (cache_exceptions=), not a value
        try:
            failure = read_failure(stored)
        except RecordFormatError as exc:
            view.error = str(exc)
            return
        view.kind = "failure"
        view.body_size = len(stored) - 1
        fields = f" {failure.fields!r}" if failure.fields else ""
        # Type and message are stored text (a message may quote what a customer typed):
        # escaped as a preview is, so no escape sequence or line break reaches a terminal.
        view.preview = _cut(shown(f"{failure.type}: {failure.message}{fields}"))
        return
    try:
        value: object = decode_value(stored)
    except RecordFormatError as exc:
        view.error = str(exc)
        return
    view.kind = "result"
    view.body_size = len(stored) - 1
    view.preview = _cut(repr(value))


def _cut(text: str) -> str:
    return text[:PREVIEW_BYTES] + ("..." if len(text) > PREVIEW_BYTES else "")


#: The lines of an unreadable head ``inspect`` shows (the status line counts).
HEAD_LINES: Final = 20


def _raw_head(stored: bytes) -> list[str]:
    """The status line and header lines of a response that does not decode as one (a header
    line 0.3 stored as the app sent it): stored text, escaped by :func:`shown` and cut."""
    try:
        value: object = decode_value(stored)
    except RecordFormatError:
        return []
    if not isinstance(value, list) or len(value) < 2:
        return []
    reason = value[4] if len(value) > 4 else ""
    lines = [f"{value[0]} {reason}" if isinstance(reason, str) else f"{value[0]} {reason!r}"]
    pairs = value[1] if isinstance(value[1], list) else [value[1]]
    for pair in pairs:
        ok = isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
        lines.append(f"{pair[0]}: {pair[1]}" if ok else repr(pair))
    shown_lines = [_cut(shown(line)) for line in lines[:HEAD_LINES]]
    if len(lines) > HEAD_LINES:
        shown_lines.append(f"... {len(lines) - HEAD_LINES} more lines")
    return shown_lines


def show_record(view: RecordView, out: IO[str]) -> None:
    if view.state == FOREIGN:  # nothing of a record to show: what it is instead
        out.write(f"{'record':<9} {shown(view.record)}\n{'state':<9} {shown(view.error)}\n")
        out.write(f"{'ttl':<9} {duration(view.ttl_ms)}{' left' if view.ttl_ms >= 0 else ''}\n")
        return
    rows: list[tuple[str, str]] = [("record", view.record), ("state", view.state)]
    if view.client_key:
        rows.append(("key", view.client_key))
    if view.origin:
        rows.append(("origin", view.origin))
    rows.append(("owner", shorten(view.owner) if view.owner else "-"))
    rows.append(("fence", str(view.fence) if view.fence is not None else "-"))
    lease = "none (no live claim)" if view.lease_ms == -2 else duration(view.lease_ms) + " left"
    rows.append(("lease", lease))
    rows.append(("ttl", duration(view.ttl_ms) + (" left" if view.ttl_ms >= 0 else "")))
    if view.at:
        rows.append(("updated", view.at))
    if view.kind == "response":
        assert view.status is not None
        rows.append(("status", str(view.status)))
        kept = "" if view.body_kept else " (body not kept: too large or streamed)"
        rows.append(("body", f"{view.body_size} bytes{kept}"))
    elif view.kind == "result":
        rows.append(("result", f"{view.body_size} bytes (guard result, msgpack)"))
    elif view.kind == "failure":
        rows.append(("result", "a remembered failure (cache_exceptions), raised on every retry"))
    if view.steps:
        rows.append(("steps", f"{len(view.steps)} finished: {', '.join(view.steps)}"))
    if view.error:
        rows.append(("stored", f"unreadable: {view.error}"))
    # Owner, steps, headers and the reason a value is unreadable are stored text too (any
    # writer's): escaped, as the preview is, so no escape sequence or line break reaches the
    # terminal (a forged row, a cleared screen).
    for name, value in rows:
        out.write(f"{name:<9} {shown(value)}\n")
    if view.kind == "response":
        out.write(f"{'headers':<9} {len(view.headers)}\n")
        for name, value in view.headers:
            out.write(f"  {shown(name)}: {shown(value)}\n")
    for line in view.head:  # escaped already (_raw_head): printed as it is
        out.write(f"  {line}\n")
    if view.preview:
        out.write(f"preview   {shown(view.preview)}\n")
