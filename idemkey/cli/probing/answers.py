"""What ``idemkey probe`` observed and how a line shows it, no network: an answer
(:class:`Response`, :class:`NoResponse`), a check's :class:`Result` and its :data:`Verdict`,
the evidence a line shows of an answer, and how two bodies differ field by field. The judges
that turn answers into verdicts live in :mod:`.verdicts`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from ..readable import shown as escaped

__all__ = [
    "Answer",
    "NoResponse",
    "Response",
    "Result",
    "Verdict",
    "body_differences",
    "evidence",
    "excerpt",
    "header_line",
    "worst",
]

Verdict = Literal["PASS", "WARN", "INCONCLUSIVE", "FAIL", "SKIP"]
_RANK: Final[dict[Verdict, int]] = {"SKIP": 0, "PASS": 1, "WARN": 2, "INCONCLUSIVE": 3, "FAIL": 4}

EXCERPT_CHARS: Final = 40
MAX_FIELD_LINES: Final = 6


@dataclass(frozen=True, slots=True)
class Response:
    """An answer: status, headers, body, and when (monotonic seconds) it was sent and began."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    sent_at: float = 0.0
    answered_at: float = 0.0
    #: The body went on past what the probe reads (``transport.MAX_BODY_BYTES``): ``body`` is
    #: its start only, so two such bodies equal here may differ after it.
    truncated: bool = False

    def header(self, name: str) -> str | None:
        wanted = name.lower()
        return next((v for n, v in self.headers if n.lower() == wanted), None)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def same_as(self, other: Response) -> bool:
        """Same status and byte-equal body: what a replay must be."""
        return self.status == other.status and self.body == other.body


@dataclass(frozen=True, slots=True)
class NoResponse:
    """No answer: a timeout, a reset connection, a malformed response."""

    reason: str
    sent_at: float = 0.0


Answer = Response | NoResponse


@dataclass(frozen=True, slots=True)
class Result:
    """One check's verdict, a one-line summary with the evidence, and detail lines."""

    number: int
    name: str
    verdict: Verdict
    summary: str
    details: tuple[str, ...] = ()


def worst(results: Sequence[Result]) -> Verdict:
    """The most severe verdict (``SKIP`` only when nothing ran)."""
    return max((r.verdict for r in results), key=_RANK.__getitem__, default="SKIP")


def header_line(name: str, value: str) -> str:
    """``Name: value`` as a line shows a header: the server's text with what a terminal would
    act on (escape sequences, a carriage return) escaped."""
    return f"{escaped(name)}: {escaped(value)}"


def excerpt(body: bytes, limit: int = EXCERPT_CHARS) -> str:
    """The start of a body as printable text, for a line of evidence."""
    text = body[:limit].decode("utf-8", "replace")
    text = "".join(c if c.isprintable() else "." for c in text)
    return text + ("..." if len(body) > limit else "")


def evidence(answer: Answer, replay_header: str) -> str:
    """``201, Idempotent-Replayed: true, body {"id": ...}``: what a line shows of an answer.

    What a server tells beyond the draft is shown when it gives it: a header naming the
    retention (``Idempotency-Retention: 86400``), and a problem's ``retry`` and ``retention``
    members (``retry: new_key, retention: 86400 s``)."""
    if isinstance(answer, NoResponse):
        return answer.reason
    parts = [str(answer.status)]
    for name in (replay_header, "Retry-After"):
        value = answer.header(name)
        if value is not None:
            parts.append(header_line(name, value))
    parts.extend(header_line(n, v) for n, v in answer.headers if "retention" in n.lower())
    parts.extend(guidance(answer))
    parts.append(f"body {excerpt(answer.body)}" if answer.body else "empty body")
    return ", ".join(parts)


def guidance(answer: Response) -> list[str]:
    """A problem document's ``retry`` and ``retention`` members, as evidence shows them."""
    if not (answer.header("Content-Type") or "").startswith("application/problem+json"):
        return []
    document = _json_object(answer.body) or {}
    shown = []
    retry = document.get("retry")
    if isinstance(retry, str):
        shown.append(f"retry: {escaped(retry)}")
    retention = document.get("retention")
    if isinstance(retention, int) and not isinstance(retention, bool):
        shown.append(f"retention: {retention} s")
    return shown


def _json_object(body: bytes) -> dict[str, object] | None:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):  # a server's body nested deeper than Python parses
        return None
    return value if isinstance(value, dict) else None


def _field_changes(old: dict[str, object], new: dict[str, object], path: str = "") -> Iterator[str]:
    for name in dict.fromkeys([*old, *new]):
        where = f"{path}.{escaped(name)}" if path else escaped(name)
        a, b = old.get(name, _MISSING), new.get(name, _MISSING)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            yield from _field_changes(a, b, where)
        else:
            yield f"{where}: {_shown(a)} -> {_shown(b)}"


_MISSING: Final = object()


def _shown(value: object) -> str:
    if value is _MISSING:
        return "(absent)"
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def body_differences(first: bytes, second: bytes) -> tuple[str, ...]:
    """How two bodies differ: field by field for JSON objects, else the first differing byte."""
    old, new = _json_object(first), _json_object(second)
    if old is not None and new is not None:
        changes = list(_field_changes(old, new))
        if not changes:  # the same fields, serialized differently
            return ("same JSON fields, different bytes (key order or whitespace)",)
        shown = changes[:MAX_FIELD_LINES]
        if len(changes) > len(shown):
            shown.append(f"... and {len(changes) - len(shown)} more fields")
        return tuple(shown)
    at = next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), None)
    at = min(len(first), len(second)) if at is None else at
    return (
        f"bytes differ from offset {at} ({len(first)} vs {len(second)} bytes)",
        f"first:  {excerpt(first[at:])}",
        f"second: {excerpt(second[at:])}",
    )
