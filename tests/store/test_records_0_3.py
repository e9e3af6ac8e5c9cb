"""Records written by idemkey 0.3.0 and by this version, against one Redis, as a rolling deploy
(or a rollback) has them: docs/operators.md, "Upgrading from 0.3", promises that completed
records replay in both directions and that a claim either holds is in flight for the other.

0.3.0 runs as released: its package is taken from the clone (``git archive fe2a8af idemkey``,
the 0.3.0 commit) and run in one subprocess, with this venv's packages, that takes commands on
stdin and answers each with a line of JSON. The Celery case runs 0.3.0's IdempotentTask eagerly
(``Task.apply``) and then encodes its result with kombu's JSON, as a 0.3.0 worker's result
backend would (a real worker is not needed for that: eager apply returns what the worker would).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
import redis

pytest.importorskip("celery")  # nox -s minimal runs tests/store with no framework installed

from celery import Celery

from idemkey import Policy, RedisStore, guard
from idemkey.contrib.celery import IdempotentTask
from idemkey.errors import RequestInFlightError
from idemkey.records import Claimed, InFlight, record_for

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
RELEASE_0_3 = "fe2a8af"

# The 0.3.0 side: one command a line, one JSON answer a line.
OLD_SIDE = r"""
import json, sys, traceback
import redis
from celery import Celery
from kombu.utils import json as kombu_json
from idemkey import Policy, RedisStore, guard
from idemkey.contrib.celery import IdempotentTask
from idemkey.records import record_for

url, prefix = sys.argv[1:3]
store = RedisStore(redis.Redis.from_url(url), Policy(prefix=prefix, wait=0))
app = Celery("old", set_as_current=False)
app.conf.result_serializer = "json"

@app.task(base=IdempotentTask, shared=False, name="up.total", idempotency_store=store)
def total(order_id):
    return {"order": order_id, "by": "0.3.0", "items": [1, "a"], "ok": True}

held = []
for line in sys.stdin:
    cmd = json.loads(line)
    op = cmd["op"]
    try:
        if op == "save":
            with guard(store, cmd["key"], scope=cmd["scope"], payload={"p": 1}) as call:
                call.save(cmd["value"])
            answer = {"replayed": call.replayed}
        elif op == "read":
            with guard(store, cmd["key"], scope=cmd["scope"], payload={"p": 1}) as call:
                if not call.replayed:
                    raise RuntimeError("ran again")
            answer = {"result": call.result}
        elif op == "claim":
            record = record_for(prefix, "acct_1", "POST", "/charges", cmd["key"])
            answer = {"decision": type(store.claim(record, "fp-1", heartbeat=False)).__name__}
        elif op == "hold":  # a guard's claim in progress, with the origin 0.3.0 keeps
            context = guard(store, cmd["key"], scope=cmd["scope"], payload={"p": 1})
            held.append(context)
            answer = {"replayed": context.__enter__().replayed}
        elif op == "celery":
            result = total.apply((cmd["order"],)).get()
            answer = {"type": type(result).__name__}
            try:  # what a 0.3.0 worker's result backend then sends, with Celery's JSON
                answer["sent"] = json.loads(kombu_json.dumps(result))
            except Exception as exc:
                answer["sent"] = f"{type(exc).__name__}: {exc}"
        else:
            raise ValueError(op)
    except Exception as exc:
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(answer), flush=True)
"""


class Old:
    """The 0.3.0 subprocess."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    def __call__(self, op: str, **args: object) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()  # the subprocess answers or exits (EOF)
        assert line, f"0.3.0 side exited: {self.process.poll()}"
        answer: dict[str, Any] = json.loads(line)
        return answer


@pytest.fixture(scope="session")
def package_0_3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        archived = subprocess.run(
            ["git", "-C", str(ROOT), "archive", RELEASE_0_3, "idemkey"],
            capture_output=True,
            check=False,
        )
    except FileNotFoundError:
        pytest.skip("git is not installed: 0.3.0's package is taken from the clone's history")
    if archived.returncode != 0:
        pytest.skip(f"0.3.0 ({RELEASE_0_3}) is not in this clone (a shallow clone?)")
    where = tmp_path_factory.mktemp("idemkey-0.3.0")
    with tarfile.open(fileobj=BytesIO(archived.stdout)) as tar:
        # Our own history, so safe either way; `filter` exists from 3.10.12 and 3.11.4.
        if hasattr(tarfile, "data_filter"):
            tar.extractall(where, filter="data")
        else:  # pragma: no cover - older patch releases
            tar.extractall(where)
    return where


@pytest.fixture
def old(package_0_3: Path, redis_url: str, prefix: str) -> Iterator[Old]:
    env = {**os.environ, "PYTHONPATH": str(package_0_3)}
    process = subprocess.Popen(
        [sys.executable, "-c", OLD_SIDE, redis_url, prefix],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=package_0_3,
    )
    try:
        yield Old(process)
    finally:
        process.communicate(timeout=30)  # closes its stdin: it exits, and its pipes are closed


@pytest.fixture
def store(real_client: redis.Redis, prefix: str) -> Iterator[RedisStore]:
    store = RedisStore(real_client, Policy(prefix=prefix, wait=0))
    try:
        yield store
    finally:
        store.close()


def test_the_subprocess_runs_0_3_0(package_0_3: Path) -> None:
    ran = subprocess.run(
        [sys.executable, "-c", "import idemkey; print(idemkey.__version__, idemkey.__file__)"],
        env={**os.environ, "PYTHONPATH": str(package_0_3)},
        cwd=package_0_3,
        capture_output=True,
        text=True,
        check=True,
    )
    assert ran.stdout.startswith(f"0.3.0 {package_0_3}")


def test_a_completed_guard_record_replays_both_ways(old: Old, store: RedisStore) -> None:
    assert old("save", key="by-old", scope="acct_1", value={"charge": "ch_old"}) == {
        "replayed": False
    }
    with guard(store, "by-old", scope="acct_1", payload={"p": 1}) as call:
        assert call.replayed
        assert call.result == {"charge": "ch_old"}
    with guard(store, "by-new", scope="acct_1", payload={"p": 1}) as call:
        call.save({"charge": "ch_new"})
    assert old("read", key="by-new", scope="acct_1") == {"result": {"charge": "ch_new"}}


def test_a_claim_either_holds_is_in_flight_for_the_other(old: Old, store: RedisStore) -> None:
    assert old("claim", key="held-by-old") == {"decision": "Claimed"}
    assert isinstance(
        store.claim(
            record_for(store.policy.prefix, "acct_1", "POST", "/charges", "held-by-old"),
            "fp-1",
            heartbeat=False,
        ),
        InFlight,
    )
    record = record_for(store.policy.prefix, "acct_1", "POST", "/charges", "held-by-new")
    assert isinstance(store.claim(record, "fp-1", heartbeat=False), Claimed)
    assert old("claim", key="held-by-new") == {"decision": "InFlight"}
    # A guard's claim too: 0.3.0's held, this version's guard is in flight (wait=0).
    assert old("hold", key="g-held", scope="acct_1") == {"replayed": False}
    same = {"p": 1}
    with pytest.raises(RequestInFlightError), guard(store, "g-held", scope="acct_1", payload=same):
        pass


def test_a_celery_result_this_version_stored_is_sent_by_a_0_3_0_worker(
    old: Old, store: RedisStore
) -> None:
    app = Celery("new", set_as_current=False)
    app.conf.result_serializer = "json"

    @app.task(base=IdempotentTask, shared=False, name="up.total", idempotency_store=store)
    def total(order_id: str) -> object:
        return {"order": order_id, "by": "main", "items": [1, "a"], "ok": True}

    first = total.apply(("o-new",)).get()
    # 0.3.0 returned the stored value as the result: an Ext before, which kombu could not send.
    assert old("celery", order="o-new") == {"type": "dict", "sent": first}
    assert old("celery", order="o-old")["sent"]["by"] == "0.3.0"
    assert total.apply(("o-old",)).get() == {
        "order": "o-old",
        "by": "0.3.0",
        "items": [1, "a"],
        "ok": True,
    }


def test_the_origin_of_a_record_0_3_0_claimed_after_this_version_released_it(
    old: Old, store: RedisStore
) -> None:
    # A long key: this version's origin takes three pieces; 0.3.0's claim rewrites "i" only.
    key = "invoice-" + "x" * 90
    with pytest.raises(RuntimeError), guard(store, key, scope="acct_7", payload={"p": 1}):
        raise RuntimeError("released")
    assert old("hold", key=key, scope="acct_7") == {"replayed": False}
    [found] = store.records(scope="acct_7")
    assert found.scope == "acct_7"
    assert found.state == "in_progress"
