"""A client error raised in one process reaches a caller in another as itself (Celery).

A Celery worker pickles a task's exception for its caller; one that fails to pickle reaches it
as the nearest base class that does, its fields lost (``RetriesExhaustedError.key``, the only
way to resume a ``post()``). Each error here comes from a real client over a real socket, one
built with ``default_encoding=<a lambda>``: httpx sets that on every response, which then does
not pickle. The caller is a fresh interpreter that unpickles them.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from idemkey.client import (
    AsyncClient,
    Client,
    ClientError,
    RefusedError,
    RetriesExhaustedError,
    RetryPolicy,
    UnexpectedReplayError,
    UnusableAnswerError,
)

from ._scripted_server import ScriptedServer, Seen, answer

ROOT = Path(__file__).resolve().parents[2]
TWO = RetryPolicy(max_attempts=2, deadline=10.0, backoff=0.01, backoff_cap=0.01)
PROBLEM = {"type": "urn:idemkey:problem:key_reused", "code": "key_reused", "detail": "déjà"}

#: The caller: a fresh interpreter reads what it got.
CALLER = """
import json, pickle, sys
from tests.client.test_errors_across_processes import read
print(json.dumps([read(error) for error in pickle.loads(sys.stdin.buffer.read())]))
"""


def respond(seen: Seen) -> bytes:
    if seen.target == "/refused":
        body = json.dumps(PROBLEM).encode()
        return answer(422, [("Content-Type", "application/problem+json")], body)
    if seen.target == "/busy":
        return answer(503, [("Content-Type", "text/plain"), ("Retry-After", "0")], b"busy")
    if seen.target == "/replayed":
        headers = [("Content-Type", "application/json"), ("Idempotent-Replayed", "true")]
        return answer(201, headers, b'{"id": "ch_1"}')
    return answer(200, [("Content-Encoding", "gzip")], b"not gzip")  # httpx raises on it


def read(error: ClientError) -> dict[str, Any]:
    """What a caller reads of ``error``, as JSON."""
    seen: dict[str, Any] = {"type": type(error).__name__, "message": str(error)}
    names = ("code", "problem", "retry", "status", "attempts", "reason", "last", "key")
    seen.update({name: getattr(error, name) for name in names if hasattr(error, name)})
    response = getattr(error, "response", None)
    if isinstance(error, UnexpectedReplayError):
        seen["replayed"] = (error.reply.replayed, error.reply.key, error.reply.after_lost)
        response = error.reply.response
    if response is not None:
        request = response.request
        seen["response"] = (response.status_code, response.headers.multi_items(), response.text)
        seen["request"] = (request.method, str(request.url), request.headers["idempotency-key"])
    return json.loads(json.dumps(seen))


def raised(shell: str, url: str) -> list[ClientError]:
    """The error each path of the scripted server ends a call with."""
    options: Any = {"base_url": url, "retry": TWO, "on_replay": "refuse", "timeout": 5.0}
    options["default_encoding"] = lambda content: "utf-8"
    errors: list[ClientError] = []
    paths = ("/refused", "/busy", "/replayed", "/garbled")
    if shell == "client":
        with Client(**options) as client:
            for path in paths:
                try:
                    client.post(path, json={"amount": 1})
                except ClientError as exc:
                    errors.append(exc)
        return errors

    async def main() -> None:
        async with AsyncClient(**options) as aclient:
            for path in paths:
                try:
                    await aclient.post(path, json={"amount": 1})
                except ClientError as exc:
                    errors.append(exc)

    asyncio.run(main())
    return errors


@pytest.mark.parametrize("shell", ["client", "async-client"])
def test_each_client_error_reaches_a_caller_in_another_process_as_itself(shell: str) -> None:
    with ScriptedServer(respond) as server:
        errors = raised(shell, server.url)
    kinds = (RefusedError, RetriesExhaustedError, UnexpectedReplayError, UnusableAnswerError)
    assert [type(error) for error in errors] == list(kinds)
    done = subprocess.run(
        [sys.executable, "-c", CALLER], input=pickle.dumps(errors), capture_output=True,
        cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    crossed = json.loads(done.stdout)
    assert crossed == [read(error) for error in errors]
    refused, gave_up = crossed[:2]
    assert json.loads(refused["response"][2]) == PROBLEM
    assert gave_up["key"] == gave_up["request"][2]  # the key it sent: the call resumes with it


@pytest.mark.parametrize("shell", ["client", "async-client"])
def test_a_pickled_error_carries_no_credential_of_the_request(shell: str) -> None:
    # What a Celery result backend stores: no Authorization, no user:password in the URL, and
    # no query (?api_key=...), which the retry log line and the redirect warning leave out too.
    headers = {"Authorization": "Bearer AUTH_TOKEN", "Cookie": "session=SESSION_ID"}
    with ScriptedServer(lambda _: answer(503, [("Retry-After", "0")])) as server:
        url = server.url.replace("http://", "http://admin:HUNTER2@") + "/pay?api_key=sk_TOKEN"
        options: Any = {"retry": RetryPolicy(max_attempts=1), "headers": headers}

        def call() -> None:
            if shell == "client":
                with Client(**options) as client:
                    client.post(url, json={})
                return

            async def main() -> None:
                async with AsyncClient(**options) as aclient:
                    await aclient.post(url, json={})

            asyncio.run(main())

        with pytest.raises(RetriesExhaustedError) as ended:
            call()
    blob = pickle.dumps(ended.value)
    for secret in (b"AUTH_TOKEN", b"SESSION_ID", b"HUNTER2", b"sk_TOKEN"):
        assert secret not in blob
    back = pickle.loads(blob)
    assert str(back.response.request.url) == server.url + "/pay"
    assert back.key == ended.value.key
