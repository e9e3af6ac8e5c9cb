"""One record, as ``inspect`` and ``forget`` name it on the command line, read and shown."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import IO, Any

from .._codec import StoredResponse, decode_response, decode_value
from .._core import OWNER_TAG_LENGTH, Record, parse_key, record_for, record_state
from ..errors import InvalidKeyError, RecordFormatError
from ..guard import GUARD_METHOD
from ..store.diagnostics import _text as text
from ._base import CliError
from ._format import PREVIEW_BYTES, duration, preview, shorten

__all__ = ["RecordView", "add_record_options", "read_record", "record_named", "show_record"]


def add_record_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key", nargs="?", metavar="KEY", help="the Idempotency-Key value")
    parser.add_argument("--scope", default="", help="the tenant scope (Policy.scope's answer)")
    parser.add_argument("--method", default="POST", help="HTTP method (default: POST)")
    parser.add_argument("--route", default="", help="route template, e.g. /charges")
    parser.add_argument("--guard", action="store_true", help="a guard()/@idempotent record")
    parser.add_argument("--digest", help="name the record by its digest (from logs, events)")


def record_named(args: argparse.Namespace) -> Record:
    """The record named on the command line: by digest, or by key, scope, method and route."""
    prefix = args.prefix
    if args.digest:
        digest = args.digest.strip().lower()
        if not (len(digest) == 32 and all(c in "0123456789abcdef" for c in digest)):
            raise CliError("--digest must be the 32 hex digits inside the record's braces", 2)
        if args.key is not None:
            raise CliError("give either KEY or --digest, not both", 2)
        name = f"{prefix}:{{{digest}}}"
        return Record(digest, name, name + ":lock")
    if args.key is None:
        raise CliError("give the idempotency KEY (or --digest D)", 2)
    if args.guard:
        return record_for(prefix, args.scope, GUARD_METHOD, "", args.key)
    if not args.route:
        raise CliError("give --route (the route template, e.g. /charges) or --guard", 2)
    try:
        # The header value as the client sent it: "abc" (sf-string) and abc name one record.
        key = parse_key(args.key)
    except InvalidKeyError as exc:
        raise CliError(f"not a valid Idempotency-Key: {exc.reason}", 2) from None
    return record_for(prefix, args.scope, args.method.upper(), args.route, key)


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
    kind: str = ""  # "response", "result", or "" when nothing is stored
    status: int | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    body_size: int | None = None
    body_kept: bool | None = None
    preview: str = ""
    error: str = ""


def read_record(client: Any, record: Record, *, guard: bool | None = None) -> RecordView:
    """Read one record (hash, PTTLs) in one pipeline and decode what it stores.

    ``guard``: True for a guard() record (msgpack value), False for an HTTP response, None to
    try the response format first (when only the digest is known).
    """
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(record.record_key)
    pipe.pttl(record.record_key)
    pipe.pttl(record.lock_key)
    fields, ttl_ms, lease_ms = pipe.execute()
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
    fence = text(get("fence"))
    view.fence = int(fence) if fence.isdigit() else None
    at = text(get("at"))  # the last claim or completion: written by idemkey before 0.2 only
    if at.isdigit():
        stamp = datetime.fromtimestamp(int(at) / 1000, tz=timezone.utc)
        view.at = stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    stored = get("resp")
    if isinstance(stored, bytes) and stored:
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
                return
    if response is not None:
        view.kind = "response"
        view.status = response.status
        view.headers = [(n, v) for n, v in response.headers]
        view.body_size = len(response.body)
        view.body_kept = response.body_kept
        view.preview = preview(response.body)
        return
    try:
        value: object = decode_value(stored)
    except RecordFormatError as exc:
        view.error = str(exc)
        return
    view.kind = "result"
    view.body_size = len(stored) - 1
    shown = repr(value)
    view.preview = shown[:PREVIEW_BYTES] + ("..." if len(shown) > PREVIEW_BYTES else "")


def show_record(view: RecordView, out: IO[str]) -> None:
    rows: list[tuple[str, str]] = [("record", view.record), ("state", view.state)]
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
    if view.error:
        rows.append(("stored", f"unreadable: {view.error}"))
    for name, value in rows:
        out.write(f"{name:<9} {value}\n")
    if view.kind == "response":
        out.write(f"{'headers':<9} {len(view.headers)}\n")
        for name, value in view.headers:
            out.write(f"  {name}: {value}\n")
    if view.preview:
        out.write(f"preview   {view.preview}\n")
