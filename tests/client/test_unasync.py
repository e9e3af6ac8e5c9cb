"""``idemkey/client/_sync.py`` is the generated twin of ``_async.py``, and has not drifted."""

from __future__ import annotations

import io
import tokenize

from .unasync import SOURCE, TARGET, unasync


def tokens(text: str) -> list[tuple[int, str]]:
    """The code's tokens, blind to what ``ruff format`` may change: line breaks inside
    brackets, indentation width and magic trailing commas."""
    out: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
            continue
        if (
            token.type == tokenize.OP
            and token.string in ")]}"
            and out
            and out[-1]
            == (
                tokenize.OP,
                ",",
            )
        ):
            out.pop()
        out.append((token.type, token.string))
    return out


def test_the_sync_shell_is_generated_from_the_async_one() -> None:
    generated, committed = tokens(unasync(SOURCE.read_text())), tokens(TARGET.read_text())
    assert generated == committed, (
        "idemkey/client/_sync.py is stale: run `python -m tests.client.unasync` and "
        "`ruff format idemkey/client/_sync.py`"
    )


def test_the_check_sees_a_change() -> None:
    source = SOURCE.read_text()
    edited = source.replace("schedule.failed(kind, time.monotonic())", "schedule.failed(kind, 0)")
    assert edited != source
    assert tokens(unasync(edited)) != tokens(TARGET.read_text())
