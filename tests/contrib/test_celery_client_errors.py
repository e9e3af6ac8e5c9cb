"""A client error a Celery task raises reaches the task's caller as itself, through Celery's
default JSON results (not pickle).

Celery's JSON result backend stores an exception as its type and ``args`` (an argument JSON
cannot encode, an ``httpx.Response``, as its repr) and the caller's ``result.get()`` raises
``type(exc)(*args)``; a class that does not rebuild so reaches it as a bare ``Exception``.
Each client error keeps the plain values a caller reads in its ``args``: it rebuilds with its
fields and message, and ``response`` (``reply``) None. Pickle (tests/unit/test_error_pickling.py)
still carries the response.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("celery")

from celery import Celery
from celery.backends.base import BaseBackend

from idemkey.client import (
    ClientError,
    IdempotentResponse,
    RefusedError,
    RetriesExhaustedError,
    UnexpectedReplayError,
    UnusableAnswerError,
)
from tests.client._scripted_server import ScriptedServer
from tests.client.test_errors_across_processes import PROBLEM, respond
from tests.contrib._celery_process import start_worker, stop_worker

#: What a caller reads of each error (and of its response, which the JSON path leaves None).
FIELDS = ("code", "problem", "retry", "status", "attempts", "reason", "last", "key")


def fields(error: BaseException) -> dict[str, Any]:
    seen = {name: getattr(error, name) for name in FIELDS if hasattr(error, name)}
    return {"type": type(error), "message": str(error), **seen}


def through_json(error: BaseException) -> BaseException:
    """``error`` as a Celery caller gets it back from a JSON result backend (the default)."""
    backend = BaseBackend(Celery("client-errors", set_as_current=False))
    assert backend.serializer == "json"
    stored = backend.encode({"status": "FAILURE", "result": backend.prepare_exception(error)})
    return backend.exception_to_python(backend.decode(stored)["result"])  # type: ignore[no-any-return]


def errors() -> list[ClientError]:
    sent = httpx.Request("POST", "https://api.example/charges", headers={"Idempotency-Key": "k"})
    refusal = httpx.Response(422, json=PROBLEM, request=sent)
    busy = httpx.Response(503, content=b"busy", request=sent)
    headers = {"Idempotent-Replayed": "true"}
    replay = httpx.Response(201, json={"id": "ch_1"}, headers=headers, request=sent)
    return [
        RefusedError("key_reused", PROBLEM, refusal, 2),
        RetriesExhaustedError("attempts", "503", 3, busy, "key-1"),
        RetriesExhaustedError("deadline", "timeout", 1, None, "key-2"),
        UnexpectedReplayError(IdempotentResponse(replay, "key-3", 2)),
        UnusableAnswerError("key-4", 2),
    ]


@pytest.mark.parametrize("error", errors(), ids=lambda error: type(error).__name__)
def test_each_client_error_crosses_celerys_json_results_with_its_fields(
    error: ClientError,
) -> None:
    again = through_json(error)
    assert fields(again) == fields(error)
    assert getattr(again, "response", None) is None
    assert getattr(again, "reply", None) is None
    # Crossed again (a task re-raising what a subtask's get() raised), by JSON or pickle.
    assert fields(through_json(again)) == fields(error)
    assert fields(pickle.loads(pickle.dumps(again))) == fields(error)


# ---- through a real worker: Celery's defaults, the prefork pool, a Redis result backend ----


@pytest.fixture
def worker(private_redis_server: Any, prefix: str, tmp_path: Path) -> Iterator[Celery]:
    """A prefork worker of tests/contrib/_celery_client_errors_worker.py; the caller's app."""
    url = private_redis_server.url
    process = start_worker(
        "tests.contrib._celery_client_errors_worker", url, prefix, tmp_path / "worker.log",
        hostname=f"ce-{prefix}@localhost",
    )  # fmt: skip
    app = Celery("idemkey_client_errors", broker=url, backend=url, set_as_current=False)
    app.conf.task_default_queue = prefix
    try:
        yield app
    finally:
        app.close()
        stop_worker(process)


@pytest.mark.redis
def test_a_task_that_used_the_client_raises_its_error_into_the_caller(worker: Celery) -> None:
    kinds = [RefusedError, RetriesExhaustedError, UnexpectedReplayError, UnusableAnswerError]
    with ScriptedServer(respond) as server:
        paths = ["/refused", "/busy", "/replayed", "/garbled"]
        results = [worker.send_task("tests.client_post", (server.url, path)) for path in paths]
        got = []
        for result in results:
            with pytest.raises(ClientError) as caught:
                result.get(timeout=30)
            got.append(caught.value)
    assert [type(error) for error in got] == kinds
    refused, gave_up, replayed, unusable = got
    assert fields(refused) == {
        "type": RefusedError,
        "message": "422 key_reused: déjà",
        "code": "key_reused",
        "problem": PROBLEM,
        "retry": None,
        "status": 422,
        "attempts": 1,
    }
    assert refused.response is None
    keys = [seen.headers["idempotency-key"] for seen in server.seen]
    assert (gave_up.reason, gave_up.last, gave_up.attempts) == ("attempts", "503", 2)
    assert gave_up.response is None
    assert gave_up.key == keys[1] == keys[2]  # the key it sent: the call resumes with it
    assert (replayed.key, replayed.attempts, replayed.reply) == (keys[3], 1, None)
    assert str(replayed).startswith("201 replayed on attempt 1")
    assert (unusable.key, unusable.attempts) == (keys[4], 1)
