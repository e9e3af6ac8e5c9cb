"""idemkey.contrib.celery with a real Celery worker process and a real Redis broker.

Each test starts a private redis-server (broker, result backend and idempotency records) and
``celery worker`` processes, and stops them after. What users rely on: duplicates of one
task call run it once and all get its result (a duplicate in flight is a Celery retry, not a
failure, whose countdown is the ``retry_after`` it logs); a task whose process is SIGKILLed
mid-task (a prefork pool child, as the OOM killer does, or the whole solo or threads worker) has its
message redelivered, and the next run takes the record over after the lease and resumes
after the finished steps; a task delivered while the idemkey Redis is down is retried until
it is back, and then runs once.
"""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import msgspec
import pytest
import redis

pytest.importorskip("celery")

from celery import Celery

from idemkey import Policy, RedisStore, ResultNotStorableError, StoreError, guard
from idemkey.contrib.celery import IdempotentTask
from tests._servers import RedisServer, wait_until
from tests.contrib._celery_app import STEPS, TYPED, CardDeclined, make_app
from tests.contrib._celery_process import start_worker as celery_worker
from tests.contrib._celery_process import stop_worker

pytestmark = pytest.mark.redis

StartWorker = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def url(private_redis_server: object) -> str:
    return private_redis_server.url  # type: ignore[attr-defined,no-any-return]


@pytest.fixture
def client(url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(url)
    yield client
    client.close()


@pytest.fixture
def app(url: str, prefix: str) -> Iterator[Celery]:
    app = make_app(url, prefix)
    yield app
    # A test's AsyncResults sit in reference cycles with the result backend; collected later,
    # their __del__ unsubscribes from a Redis this test has stopped (Celery 5.3 then warns from
    # __del__: an unraisable error in whichever test runs next). Collect them while it answers.
    # Celery 5.3 also leaves open the sockets of the threads that sent tasks (Celery's leak, not
    # idemkey's: newer Celery closes them in close()); they are dropped here without a warning.
    app.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.fixture
def start_worker(url: str, prefix: str, tmp_path: Path) -> Iterator[StartWorker]:
    workers: list[subprocess.Popen[bytes]] = []

    def start(
        pool: str = "prefork", concurrency: int = 1, store_url: str | None = None
    ) -> subprocess.Popen[bytes]:
        env = {} if store_url is None else {"IDEMKEY_CELERY_STORE_URL": store_url}
        worker = celery_worker(
            "tests.contrib._celery_worker", url, prefix, tmp_path / f"worker-{len(workers)}.log",
            hostname=f"w{len(workers)}-{prefix}@localhost", pool=pool, concurrency=concurrency,
            env=env,
        )  # fmt: skip
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        stop_worker(worker)


def test_the_same_task_sent_three_times_at_once_runs_once_and_all_get_its_result(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    task = app.tasks["tests.slow_total"]
    start_worker("threads", concurrency=3)

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: task.delay("o-1", amount=21), range(3)))
    assert len({result.id for result in results}) == 3  # three messages, three delivery ids

    wait_until(lambda: client.get(f"{prefix}:runs") == b"1", timeout=20, message="first run")
    # The two duplicates found the call in flight: Celery retries, not failures.
    wait_until(
        lambda: sum(result.state == "RETRY" for result in results) == 2,
        timeout=20,
        message="the duplicates to be retried",
    )
    client.rpush(f"{prefix}:go", 1)  # let the one run finish

    values = [result.get(timeout=30) for result in results]
    assert values[0] == values[1] == values[2]
    assert values[0]["total"] == 42
    assert client.get(f"{prefix}:runs") == b"1"
    # Waiting out the first run did not spend the duplicates' retries (max_retries).
    assert [result.retries for result in results] == [0, 0, 0]
    # Same call, positional or keyword: the stored result, no new run.
    assert task.delay("o-1", 21).get(timeout=30) == values[0]
    assert client.get(f"{prefix}:runs") == b"1"


@pytest.mark.parametrize("pool", ["prefork", "solo", "threads"])
def test_a_task_killed_mid_task_is_redelivered_and_the_next_run_resumes_after_finished_steps(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker, pool: str
) -> None:
    # prefork (Celery's default): the OOM killer's SIGKILL hits the pool child and the worker
    # lives on; solo and threads (gevent alike): the task runs in the worker process, and the
    # whole worker dies.
    task = app.tasks["tests.place_order"]  # acks_late, reject_on_worker_lost: the defaults
    client.set(f"{prefix}:block", "charge")  # the first run stops after step 2 of 3
    worker = start_worker(pool)

    result = task.delay("o-9")
    wait_until(lambda: client.get(f"{prefix}:after") == b"charge", timeout=30, message="2 steps")
    victim = int(client.get(f"{prefix}:pid") or 0)
    assert (victim != worker.pid) is (pool == "prefork")  # a pool child, or the worker itself
    os.kill(victim, signal.SIGKILL)  # mid-task: the message was never acknowledged
    if pool != "prefork":
        worker.wait(timeout=10)
        start_worker(pool)  # gets the message back once its visibility timeout passes
    steps = result.get(timeout=40)

    sides = {name: int(client.get(f"{prefix}:side:{name}") or 0) for name in STEPS}
    assert sides == dict.fromkeys(STEPS, 1)
    # reserve and charge are the killed run's, ship the takeover's (a higher fence).
    first, _, takeover = [step["fence"] for step in steps]
    assert [step["fence"] for step in steps] == [first, first, takeover]
    assert takeover > first
    assert {step["pid"] for step in steps[:2]} == {victim}
    assert steps[2]["pid"] != victim
    assert result.state == "SUCCESS"


def test_sigkill_during_a_retried_step_on_prefork_the_redelivery_continues_its_attempts(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    task = app.tasks["tests.retried_order"]
    worker = start_worker("prefork")
    result = task.delay("o-r")
    wait_until(
        lambda: client.get(f"{prefix}:after") == b"attempt-2", timeout=30, message="attempt 2"
    )
    victim = int(client.get(f"{prefix}:pid") or 0)
    assert victim != worker.pid  # the pool child
    os.kill(victim, signal.SIGKILL)  # mid-attempt: the message was never acknowledged
    steps = result.get(timeout=40)

    assert client.get(f"{prefix}:tries:charge") == b"3"  # failed, killed, succeeded
    assert steps[1]["attempt"] == 3  # the redelivered run's attempt was the third, not a first
    sides = {name: int(client.get(f"{prefix}:side:{name}") or 0) for name in STEPS}
    assert sides == dict.fromkeys(STEPS, 1)
    first, takeover, _ = [step["fence"] for step in steps]
    assert [step["fence"] for step in steps] == [first, takeover, takeover]
    assert takeover > first
    assert result.state == "SUCCESS"


def test_a_remembered_failure_fails_every_delivery_alike_and_a_transient_one_runs_again(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    task = app.tasks["tests.charge_card"]
    start_worker("prefork")
    for _ in range(3):
        with pytest.raises(CardDeclined, match="card declined for o-d"):
            task.delay("o-d", "declined").get(timeout=30)
    assert client.get(f"{prefix}:runs:o-d") == b"1"  # raised again, never run again

    with pytest.raises(ConnectionError):
        task.delay("o-f", "flaky").get(timeout=30)
    assert task.delay("o-f", "flaky").get(timeout=30) == {"order": "o-f", "runs": 2}
    assert client.get(f"{prefix}:runs:o-f") == b"2"


def test_the_caller_gets_idemkeys_own_error_class_and_a_remembered_failures_args(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    # The prefork pool pickles a task's exception and the JSON result backend rebuilds it as
    # type(exc)(*exc.args): with only its message in args, the caller got the bare IdemkeyError.
    start_worker("prefork")
    for _ in range(2):  # the run, then a delivery that finds the result was not kept
        with pytest.raises(ResultNotStorableError) as raised:
            app.tasks["tests.not_storable"].delay("o-n").get(timeout=30)
        assert raised.value.key.startswith("args:")
        assert raised.value.key in str(raised.value)
    assert client.get(f"{prefix}:runs:o-n") == b"1"
    # A remembered failure's duplicate raises it with its args, not its str() as the one arg.
    for _ in range(2):
        with pytest.raises(CardDeclined) as declined:
            app.tasks["tests.charge_card"].delay("o-a", "no-funds").get(timeout=30)
        assert declined.value.args == ("insufficient_funds", 51)
    assert client.get(f"{prefix}:runs:o-a") == b"1"


def test_celery_autoretry_sends_a_transient_failure_again_but_never_a_remembered_one(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    task = app.tasks["tests.charge_card_autoretry"]
    assert CardDeclined in task.dont_autoretry_for
    start_worker("prefork")
    declined = task.delay("o-d", "declined")
    with pytest.raises(CardDeclined, match="card declined for o-d"):
        declined.get(timeout=30)
    assert declined.retries == 0  # failed for good at once, not sent max_retries times
    assert client.get(f"{prefix}:runs:o-d") == b"1"
    flaky = task.delay("o-f", "flaky")
    assert flaky.get(timeout=30) == {"order": "o-f", "runs": 2}  # Celery sent it again
    assert flaky.retries == 1


@pytest.mark.parametrize("name", ["tests.retry_self", "tests.retry_auto"])
def test_a_celery_retry_is_never_remembered_even_when_every_exception_is(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker, name: str
) -> None:
    # idempotency_cache_exceptions=(Exception,) covers Celery's own Retry (self.retry(), or
    # autoretry_for's): it is control flow, so it releases the key, and the retry's delivery
    # runs the task again, after its finished step.
    task = app.tasks[name]
    start_worker()
    result = task.delay("o-1")
    value = result.get(timeout=30)
    assert value == {"order": "o-1", "runs": 2}
    assert (result.state, result.retries) == ("SUCCESS", 1)
    assert client.get(f"{prefix}:side:reserve") == b"1"  # the retry resumed after the step
    # The result is stored: a later send replays it, nothing runs.
    assert task.delay("o-1").get(timeout=30) == value
    assert client.get(f"{prefix}:runs:o-1") == b"2"


def test_autoretry_for_a_narrower_class_than_the_remembered_one_still_retries() -> None:
    # Exception is remembered, ConnectionError autoretried: the narrower declaration wins, so
    # Exception must not join dont_autoretry_for (Celery would then never retry at all). A
    # class remembered exactly, or a narrower one, still does (test above: CardDeclined).
    app = make_app("redis://127.0.0.1:1/0", "unused")
    assert app.tasks["tests.retry_auto"].dont_autoretry_for == ()
    assert app.tasks["tests.retry_self"].dont_autoretry_for == (Exception,)
    assert app.tasks["tests.charge_card_autoretry"].dont_autoretry_for == (CardDeclined,)


def test_celery_ignore_releases_the_key_even_when_every_exception_is_remembered(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    task = app.tasks["tests.ignore_once"]
    start_worker()
    task.delay("o-i")  # raises Ignore: Celery records no state for it
    # Sent again (one pool process: after the first ended), it runs: the key was released.
    assert task.delay("o-i").get(timeout=20) == {"order": "o-i", "runs": 2}
    assert client.get(f"{prefix}:side:reserve") == b"1"


def test_a_task_delivered_while_the_idemkey_redis_is_down_is_retried_and_then_runs_once(
    app: Celery,
    prefix: str,
    client: redis.Redis,
    start_worker: StartWorker,
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    # The records on a Redis of their own (the broker stays up), stopped before delivery.
    records = redis_server_factory()
    records.stop()
    task = app.tasks["tests.note_once"]
    start_worker(store_url=records.url)

    result = task.delay("o-3")
    wait_until(
        lambda: result.state in ("RETRY", "FAILURE", "SUCCESS"),
        timeout=30,
        message="the task to be delivered",
    )
    assert result.state == "RETRY", result.info  # the claim failed: nothing ran
    assert client.get(f"{prefix}:runs") is None

    records.restart()  # on the same port: the worker's client reconnects
    value = result.get(timeout=30)
    assert value == {"order": "o-3", "runs": 1}
    assert result.retries >= 1
    # Its record is in the records' Redis: a duplicate gets the stored result.
    assert task.delay("o-3").get(timeout=30) == value
    assert client.get(f"{prefix}:runs") == b"1"
    assert records.client().keys(f"{prefix}:*")


def test_a_claim_that_never_reaches_redis_fails_after_the_bounded_retries(
    app: Celery,
    prefix: str,
    client: redis.Redis,
    start_worker: StartWorker,
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    records = redis_server_factory()
    records.stop()
    start_worker(store_url=records.url)
    result = app.tasks["tests.note_bounded"].delay("o-4")  # 2 retries, from 0.1 s
    with pytest.raises(StoreError, match="during claim"):
        result.get(timeout=30)
    assert result.retries == 2
    assert client.get(f"{prefix}:runs") is None


# Celery's log line of a retry: "Task <name>[<id>] retry: Retry in <countdown>s: <exc>".
_RETRY_LINE = re.compile(r"retry: Retry in ([0-9.]+)s: RequestInFlightError\('.*retry in (\S+) s'")


def test_a_duplicate_in_flight_is_retried_in_the_retry_after_it_logs(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker, tmp_path: Path
) -> None:
    # The defaults: a 30 s lease and the default idempotency_retry_max, on the prefork pool.
    task = app.tasks["tests.slow_default"]
    start_worker(concurrency=2)
    first = task.delay("o-5", 4)
    wait_until(lambda: client.get(f"{prefix}:runs") == b"1", timeout=30, message="first run")
    duplicate = task.delay("o-5", 4)

    def retries_logged() -> list[tuple[str, str]]:
        return _RETRY_LINE.findall((tmp_path / "worker-0.log").read_text())

    wait_until(lambda: len(retries_logged()) >= 2, timeout=30, message="two retries logged")
    client.rpush(f"{prefix}:go", 1)
    assert first.get(timeout=30) == duplicate.get(timeout=30)
    assert client.get(f"{prefix}:runs") == b"1"
    # Each countdown is the retry_after that its RequestInFlightError says: 1 s, however
    # much of the 30 s lease is left (the Retry-After an HTTP duplicate gets).
    logged = {(float(countdown), float(said)) for countdown, said in retries_logged()}
    assert logged == {(1.0, 1.0)}


def test_the_default_key_is_the_task_name_and_bound_arguments_not_the_delivery() -> None:
    app = make_app("redis://127.0.0.1:1/0", "unused")
    task: IdempotentTask = app.tasks["tests.slow_total"]
    key, payload = task._identify(("o-1", 21), {})
    assert task._identify(("o-1",), {"amount": 21}) == (key, payload)
    assert task._identify(("o-1", 22), {})[0] != key
    custom: IdempotentTask = app.tasks["tests.place_order"]
    assert custom._identify(("o-9",), {})[0] == "order:o-9"


def test_a_task_result_says_whether_it_was_a_replay(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    # idempotency_outcome=True: the caller's AsyncResult tells the replay from the run; the
    # worker's own hooks read request.idempotent_replayed either way.
    task = app.tasks["tests.note_outcome"]
    start_worker("solo")
    first = task.delay("o-7").get(timeout=30)
    again = task.delay("o-7").get(timeout=30)
    assert first == {"result": {"order": "o-7", "runs": 1}, "replayed": False}
    assert again == {"result": {"order": "o-7", "runs": 1}, "replayed": True}
    assert client.get(f"{prefix}:runs") == b"1"
    # after_return runs once the result is stored: the report may follow the get() above.
    wait_until(lambda: client.llen(f"{prefix}:replayed") == 2, timeout=20, message="both reports")
    assert client.lrange(f"{prefix}:replayed", 0, -1) == [b"False", b"True"]


def _types(value: object) -> object:
    """``value``'s shape, each leaf replaced by its type: equal values of other types differ."""
    if isinstance(value, dict):
        return {key: _types(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [type(value), *map(_types, value)]
    return type(value)


def test_a_duplicate_gets_the_types_celerys_json_gave_the_first_caller(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    # Celery's JSON (kombu's) carries datetime, date, time, Decimal, UUID and bytes as
    # themselves: the first caller gets them, and so must every duplicate. Before, the replay
    # had a str for each (msgspec's encoding of them, decoded untyped).
    task = app.tasks["tests.typed_result"]
    start_worker()  # prefork, Celery's default
    first = task.delay("o-t").get(timeout=30)
    again = task.delay("o-t").get(timeout=30)
    assert first == {
        "order": "o-t",
        "runs": 1,
        **TYPED,
        "nested": [TYPED["nested"][0], ["pair", Decimal("0.5")]],
    }
    assert again == first
    assert _types(again) == _types(first)
    assert client.get(f"{prefix}:runs") == b"1"


def test_a_result_an_earlier_release_stored_replays_as_it_was_stored(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    # 0.3.0 stored the result's msgspec value itself: such a record, written here as it did
    # (a guard's save on the task's key and scope), still replays that value.
    task: IdempotentTask = app.tasks["tests.typed_result"]
    key, payload = task._identify(("o-old",), {})
    stored = {"order": "o-old", "runs": 0, "at": "2024-05-01T12:00:00+00:00", "total": "12.10"}
    store = RedisStore(client, Policy(prefix=prefix))
    with guard(store, key, payload=payload, scope="celery:tests.typed_result") as call:
        call.save(stored)
    start_worker()
    assert task.delay("o-old").get(timeout=30) == stored
    assert client.get(f"{prefix}:runs") is None


def test_an_in_flight_duplicate_sent_with_expires_still_gets_the_stored_result(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker, tmp_path: Path
) -> None:
    # The duplicate was delivered before its expiry; the retries that wait out the first run
    # only poll for its result, so they carry no expiry. Before, they copied the message's,
    # and once it passed Celery discarded the retry: REVOKED instead of the result.
    task = app.tasks["tests.slow_total"]  # retried every 0.3 s while the first runs
    start_worker(concurrency=2)
    first = task.delay("o-x", 3)
    wait_until(lambda: client.get(f"{prefix}:runs") == b"1", timeout=20, message="first run")
    duplicate = task.apply_async(("o-x", 3), expires=2.0)
    expiry = time.monotonic() + 2.0

    def retries_logged() -> int:
        return len(_RETRY_LINE.findall((tmp_path / "worker-0.log").read_text()))

    wait_until(lambda: retries_logged() >= 1, timeout=20, message="the duplicate's first retry")
    wait_until(lambda: time.monotonic() > expiry, timeout=10, message="the duplicate's expiry")
    before = retries_logged()
    wait_until(
        lambda: retries_logged() >= before + 2 or duplicate.state == "REVOKED",
        timeout=20,
        message="two retries after the expiry",
    )
    client.rpush(f"{prefix}:go", 1)
    assert duplicate.get(timeout=30) == first.get(timeout=30)
    assert duplicate.state == "SUCCESS"
    assert client.get(f"{prefix}:runs") == b"1"


def test_a_hard_time_limit_fails_the_task_and_a_later_send_resumes_after_its_steps(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    # What docs/queues.md says of the hard time limit: Celery records FAILURE and
    # acknowledges the message (acks_on_timeout, true by default), so nothing runs the rest
    # on its own; the same call sent again resumes after the steps the killed run finished.
    task = app.tasks["tests.place_order"]
    client.set(f"{prefix}:block", "charge")  # the first run waits after step 2 of 3
    start_worker()  # prefork: Celery enforces time limits there only
    timed_out = task.apply_async(("o-h",), time_limit=2)
    with pytest.raises(Exception, match="TimeLimitExceeded") as raised:
        timed_out.get(timeout=30)
    assert type(raised.value).__name__ == "TimeLimitExceeded"
    victim = int(client.get(f"{prefix}:pid") or 0)
    # Acknowledged, not requeued: no copy of the message is left with the broker.
    wait_until(
        lambda: client.llen(prefix) == 0 and client.hlen("unacked") == 0,
        timeout=10,
        message="the timed-out message to be acknowledged",
    )
    assert client.get(f"{prefix}:side:ship") is None

    steps = task.delay("o-h").get(timeout=30)
    sides = {name: int(client.get(f"{prefix}:side:{name}") or 0) for name in STEPS}
    assert sides == dict.fromkeys(STEPS, 1)
    assert [step["pid"] == victim for step in steps] == [True, True, False]


def test_a_forged_remembered_failure_is_never_raised_into_the_task(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    # Someone who can write the record (raw HSET) names a class the task never declared: the
    # worker raises StoredFailureError, neither the forged class nor Celery's own Retry, and
    # the task body does not run again.
    task = app.tasks["tests.charge_card"]  # declares CardDeclined only
    start_worker("prefork")
    forgeries = {
        "o-p": ["subprocess:CalledProcessError", "x", {"cmd": "rm -rf /", "returncode": 1}],
        "o-r": ["celery.exceptions:Retry", "again", {"when": 0}],
    }
    for order, forged in forgeries.items():
        with pytest.raises(Exception, match=f"card declined for {order}"):
            task.delay(order, "declined").get(timeout=30)
        records = [
            key
            for key in client.scan_iter(f"{prefix}:*", _type="hash")
            if (client.hget(key, "resp") or b"")[:1] == b"\x03"
            and f"card declined for {order}".encode() in (client.hget(key, "resp") or b"")
        ]
        assert len(records) == 1
        client.hset(records[0], "resp", b"\x03" + msgspec.msgpack.encode(forged))
        again = task.delay(order, "declined")
        with pytest.raises(Exception) as raised:  # noqa: PT011 (the type is checked below)
            again.get(timeout=30)
        assert again.state == "FAILURE"
        assert "StoredFailureError" in (again.traceback or ""), again.traceback
        assert forged[0] in str(raised.value)
        assert client.get(f"{prefix}:runs:{order}") == b"1"


# ---- options checked when the task is declared ---------------------------------------------
# On main each of these was taken by @app.task(...) and failed at every run: an untyped
# TypeError ('Redis' object is not callable, 'str' object is not callable) or a
# ConfigurationError per delivery; a retry delay of NaN or a count of -1 was used as given.


def declare(**options: object) -> IdempotentTask:
    """A task with ``options``, built as a worker builds it when it starts (app.finalize)."""
    from idemkey import RedisStore

    app = Celery("declared", set_as_current=False)
    options.setdefault(
        "idempotency_store", RedisStore(redis.Redis.from_url("redis://127.0.0.1:1/0"))
    )

    @app.task(base=IdempotentTask, shared=False, name="tests.declared", **options)
    def declared(order_id: str) -> str:
        return order_id

    app.finalize()
    return app.tasks["tests.declared"]  # type: ignore[no-any-return]


def _async_store() -> object:
    import redis.asyncio

    from idemkey import AsyncRedisStore

    return AsyncRedisStore(redis.asyncio.Redis.from_url("redis://127.0.0.1:1/0"))


BAD_OPTIONS = {
    "store=client": (
        {"idempotency_store": redis.Redis.from_url("redis://127.0.0.1:1/0")},
        "idempotency_store= (task 'tests.declared'): expected a RedisStore or a function "
        "returning one, got a Redis client (redis.client.Redis), not a store: pass RedisStore(",
    ),
    "store=async": (
        {"idempotency_store": _async_store()},
        "idempotency_store= (task 'tests.declared'): expected a RedisStore or a function "
        "returning one, got an AsyncRedisStore",
    ),
    "store=factory(x)": (
        {"idempotency_store": lambda url: None},
        "idempotency_store= (task 'tests.declared'): a store factory is called with no arguments",
    ),
    "key=str": (
        {"idempotency_key": "order_id"},
        "idempotency_key= (task 'tests.declared'): expected a function of the task's arguments "
        "returning the key, got the string 'order_id'",
    ),
    "policy=dict": (
        {"idempotency_policy": {"ttl": 60}},
        "idempotency_policy= (task 'tests.declared'): expected an idemkey.Policy or None, got dict",
    ),
    "policy=http-only": (
        {"idempotency_policy": __import__("idemkey").Policy(methods=["PUT"])},
        "idempotency_policy= (task 'tests.declared'): Policy.methods applies to HTTP requests",
    ),
    "deadline=0": (
        {"idempotency_deadline": 0},
        "idempotency_deadline= (task 'tests.declared'): expected a finite number of seconds > 0",
    ),
    "retry_max=str": (
        {"idempotency_retry_max": "2"},
        "idempotency_retry_max= (task 'tests.declared'): expected a number of seconds >= 0",
    ),
    "store_retries=-1": (
        {"idempotency_store_retries": -1},
        "idempotency_store_retries= (task 'tests.declared'): expected a count (an int >= 0), "
        "got -1",
    ),
    "store_retries=True": (
        {"idempotency_store_retries": True},
        "idempotency_store_retries= (task 'tests.declared'): expected a count (an int >= 0)",
    ),
    "store_retry_delay=nan": (
        {"idempotency_store_retry_delay": float("nan")},
        "idempotency_store_retry_delay= (task 'tests.declared'): expected a finite number",
    ),
    "store_retry_max=inf": (
        {"idempotency_store_retry_max": float("inf")},
        "idempotency_store_retry_max= (task 'tests.declared'): expected a finite number",
    ),
    "outcome=str": (
        {"idempotency_outcome": "yes"},
        "idempotency_outcome= (task 'tests.declared'): expected True or False",
    ),
    "cache_exceptions=None-fields": (
        {"idempotency_cache_exceptions": {ValueError: None}},
        "idempotency_cache_exceptions= (task 'tests.declared'): the fields of ValueError must "
        "be a tuple of attribute names",
    ),
    "cache_exceptions=str": (
        {"idempotency_cache_exceptions": "ValueError"},
        "idempotency_cache_exceptions= (task 'tests.declared'): cache_exceptions takes",
    ),
}


@pytest.mark.parametrize("name", BAD_OPTIONS)
def test_a_bad_task_option_is_refused_when_the_task_is_declared(name: str) -> None:
    from idemkey import ConfigurationError

    options, says = BAD_OPTIONS[name]
    with pytest.raises(ConfigurationError) as raised:
        declare(**options)
    assert str(raised.value).startswith(says), str(raised.value)


def test_good_task_options_are_taken() -> None:
    from idemkey import Policy, RedisStore

    def make_store() -> RedisStore:  # a factory: called in the worker, never here
        raise AssertionError("called at declaration")

    task = declare(
        idempotency_store=make_store,
        idempotency_key=lambda order_id: f"order:{order_id}",
        idempotency_policy=Policy(ttl=60),
        idempotency_deadline=5,
        idempotency_retry_max=0,
        idempotency_store_retries=0,
        idempotency_store_retry_delay=0.5,
        idempotency_store_retry_max=10,
        idempotency_outcome=True,
        idempotency_cache_exceptions={ValueError: ("args",)},
    )
    assert task.idempotency_deadline == 5
    store = RedisStore(redis.Redis.from_url("redis://127.0.0.1:1/0"))
    for factory in (lambda: store, lambda *args: store):
        assert type(declare(idempotency_store=factory)).idempotency_store is factory


def test_a_threads_worker_calls_the_store_factory_once(
    app: Celery, prefix: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    # The worker as users start it with `-P threads -c 8`: 16 tasks, one store for them all
    # (each thread's first task called the factory: 8 stores, 8 pools, 8 heartbeats).
    task = app.tasks["tests.note_once"]
    start_worker("threads", concurrency=8)
    results = [task.delay(f"o-{n}") for n in range(16)]
    assert sorted(result.get(timeout=60)["order"] for result in results) == sorted(
        f"o-{n}" for n in range(16)
    )
    assert client.get(f"{prefix}:stores") == b"1"


def test_a_store_factory_is_called_once_when_a_threads_pool_starts_its_first_tasks() -> None:
    # docs/queues.md: "called once per worker process". Under `-P threads` the first tasks of
    # every thread resolved the store at once, each calling the factory (8 stores, 8 pools).
    from idemkey import RedisStore

    store = RedisStore(redis.Redis.from_url("redis://127.0.0.1:1/0"))
    calls: list[int] = []
    second_call = threading.Event()

    def make_store() -> RedisStore:
        calls.append(1)
        if len(calls) > 1:
            second_call.set()
        else:  # the first call waits for another thread to call it too (it never should)
            second_call.wait(timeout=1)
        return store

    task = declare(idempotency_store=make_store)
    with ThreadPoolExecutor(8) as pool:
        resolved = list(pool.map(lambda _: task._resolve_store(), range(8)))
    assert resolved == [store] * 8
    assert len(calls) == 1
