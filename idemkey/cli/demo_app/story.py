"""The retry story ``idemkey demo`` plays against the demo payments app over real HTTP.

Each step sends real requests and checks what it shows: a client timeout whose charge happened
anyway, the retry that replays it, an edited retry refused, a duplicate in flight, a request
without a key, and the count of charges at the end.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Final

from ...errors import IdemkeyError
from .flask_app import create_app
from .http_client import Answer, Client, json_bytes
from .server import open_store, running

#: The Content-Type of the bodies the story sends as bytes (json_bytes).
JSON: Final = {"Content-Type": "application/json"}

if TYPE_CHECKING:
    from idemkey.client import Client as IdempotentClient
    from idemkey.client import IdempotentResponse, RetryEvent

__all__ = ["Step", "Story", "run_story"]


class StepFailed(Exception):
    pass


@dataclass
class Step:
    number: int
    title: str
    ok: bool = True
    lines: list[str] = field(default_factory=list)


class Story:
    """The retry story, step by step; each step checks what it shows."""

    def __init__(self, client: Client, out: IO[str] | None, run_id: str) -> None:
        self.client = client
        self.out = out
        self.run_id = run_id
        self.steps: list[Step] = []
        self.first_charge = ""
        self.posts = 0

    def key(self, name: str) -> str:
        return f"demo-{self.run_id}-{name}"

    def say(self, text: str) -> None:
        self.steps[-1].lines.append(text)
        if self.out is not None:
            self.out.write(f"   {text}\n")
            self.out.flush()

    def expect(self, condition: bool, failure: str) -> None:
        if not condition:
            raise StepFailed(failure)

    def step(self, number: int, title: str, run: Callable[[], None]) -> None:
        self.steps.append(Step(number, title))
        if self.out is not None:
            self.out.write(f"\n{number}. {title}\n")
        try:
            run()
        except (
            StepFailed,
            IdemkeyError,
            OSError,
            http.client.HTTPException,
            ValueError,
            KeyError,
            TypeError,
        ) as exc:
            self.steps[-1].ok = False
            self.say(f"FAILED: {exc}")
        else:
            self.say("ok")

    def post(
        self, key: str | None, body: object, timeout: float = 10.0, delay: float = 0.0
    ) -> Answer:
        self.posts += 1
        headers = {"Idempotency-Key": key} if key is not None else {}
        if delay:
            headers["Demo-Delay"] = f"{delay:g}"
        return self.client.request("POST", "/charges", body, headers, timeout)

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        pause = 0.01
        while not predicate():
            if time.monotonic() > deadline:
                raise StepFailed(f"timed out after {timeout:g} s waiting for {what}")
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def idempotent_client(self, timeout: float = 10.0) -> IdempotentClient:
        """idemkey's own client half: one key per operation, retried with backoff that
        honours Retry-After; each retry is told in the story."""
        from idemkey.client import Client as IdempotentClient
        from idemkey.client import RetryPolicy

        def told(event: RetryEvent) -> None:
            self.say(
                f"client: attempt {event.attempt} failed ({event.reason}); "
                f"retrying in {event.delay:.2f} s with the same key and bytes"
            )

        return IdempotentClient(
            base_url=self.client.base,
            timeout=timeout,
            retry=RetryPolicy(backoff=0.1, deadline=15.0),
            on_retry=told,
        )

    # The steps.

    BODY: Final = {"amount": 1000, "currency": "eur"}

    def timeout_then_charged(self) -> None:
        key = self.key("order-1")
        self.say(f"POST /charges {json.dumps(self.BODY)}  Idempotency-Key: {key}")
        self.say("the processor takes 1 s (Demo-Delay: 1); the client gives up after 0.25 s")
        started = time.monotonic()
        try:
            answer = self.post(key, self.BODY, timeout=0.25, delay=1.0)
        except TimeoutError:
            self.say(f"client: timed out after {time.monotonic() - started:.2f} s, no answer")
        else:
            raise StepFailed(f"expected a client timeout, got {answer.status}")
        self.wait_for(
            "the charge to appear",
            lambda: (listing := self.client.charges())["count"] == 1 and listing["processing"] == 0,
        )
        charge = self.client.charges()["charges"][0]
        self.first_charge = charge["id"]
        self.say(
            f"server: charged anyway: {charge['id']} ({charge['amount']} {charge['currency']})"
        )
        self.say("the client cannot tell whether it was charged: it must retry")

    def retry_replays(self) -> None:
        key = self.key("order-1")
        self.say(f"idemkey.client retries POST /charges with the same key: {key}")
        with self.idempotent_client() as client:
            operation = client.prepare(
                "POST", "/charges", content=json_bytes(self.BODY), headers=JSON, idempotency_key=key
            )
            self.posts += 1
            reply = client.send(operation)
        answer = _from_reply(reply)
        replayed = answer.header("Idempotent-Replayed")
        self.say(f"-> {answer.status}, Idempotent-Replayed: {replayed or '-'}, id {_id(answer)}")
        self.expect(answer.status == 201, f"expected 201, got {answer.status}: {answer.body}")
        self.expect(replayed == "true", "expected the header Idempotent-Replayed: true")
        self.expect(_id(answer) == self.first_charge, f"expected charge {self.first_charge}")
        count = self.client.charges()["count"]
        self.say(f"the same charge as the one the timed-out attempt made; charges: {count}")
        self.expect(count == 1, f"expected 1 charge, found {count}")

    def client_does_it_all(self) -> None:
        key = self.key("order-3")
        body = {"amount": 4200, "currency": "eur"}
        with self.idempotent_client(timeout=0.25) as client:
            operation = client.prepare(
                "POST", "/charges", json=body, headers={"Demo-Delay": "1"}, idempotency_key=key
            )
            self.say(f"POST /charges {json.dumps(body)}; key fixed before sending: {operation.key}")
            self.say("the processor takes 1 s; each attempt gives up after 0.25 s")
            self.posts += 1
            reply = client.send(operation)
        answer = _from_reply(reply)
        self.say(
            f"-> {answer.status} after {reply.attempts} attempts, "
            f"Idempotent-Replayed: {answer.header('Idempotent-Replayed') or '-'}, id {_id(answer)}"
        )
        self.expect(answer.status == 201, f"expected 201, got {answer.status}: {answer.body}")
        self.expect(reply.attempts > 1, "expected the client to retry")
        listing = self.client.charges()
        made = [c for c in listing["charges"] if c["id"] == _id(answer)]
        self.expect(len(made) == 1, f"expected charge {_id(answer)} once")
        self.say("one operation, one key, one charge, however many attempts")

    def edited_body_rejected(self) -> None:
        from idemkey.client import RefusedError

        key = self.key("order-1")
        edited = {**self.BODY, "amount": 2000}
        self.say(f"POST /charges {json.dumps(edited)}  Idempotency-Key: {key}  (edited amount)")
        with self.idempotent_client() as client:
            try:
                self.posts += 1
                client.post("/charges", json=edited, idempotency_key=key)
            except RefusedError as refused:
                self.say(f"-> {refused.status} {refused.code}: RefusedError, not retried")
                self.expect(refused.status == 422, f"expected 422, got {refused.status}")
                self.expect(refused.code == "key_reused", f"expected key_reused: {refused.code}")
            else:
                raise StepFailed("expected the edited retry to be refused")
        count = self.client.charges()["count"]
        self.say(f"nothing charged, the stored answer is untouched; charges: {count}")
        self.expect(count == 1, f"expected 1 charge, found {count}")

    def duplicate_in_flight(self) -> None:
        key = self.key("order-2")
        body = {"amount": 2500, "currency": "usd"}
        self.say(f"POST /charges {json.dumps(body)}  Idempotency-Key: {key}  (takes 1.5 s)")
        first: list[Answer | BaseException] = []

        def send_first() -> None:
            try:
                # 1.5 s: ample time for the duplicate to arrive while it runs, on a busy machine
                first.append(self.post(key, body, delay=1.5))
            except BaseException as exc:
                first.append(exc)

        thread = threading.Thread(target=send_first, daemon=True)
        thread.start()
        try:
            self.wait_for(
                "the first request to start", lambda: self.client.charges()["processing"] > 0
            )
            answer = self.post(key, body)
            retry_after = answer.header("Retry-After")
            shown = f"{answer.status} {_code(answer)}, Retry-After: {retry_after}"
            self.say(f"duplicate meanwhile -> {shown}")
            self.expect(answer.status == 409, f"expected 409, got {answer.status}: {answer.body}")
            self.expect(retry_after.isdigit(), "expected a Retry-After header in seconds")
        finally:
            thread.join(15)
        self.expect(bool(first), "the first request did not finish")
        outcome = first[0]
        if isinstance(outcome, BaseException):
            raise StepFailed(f"the first request failed: {outcome!r}")
        self.say(f"first request -> {outcome.status}, id {_id(outcome)}")
        self.expect(outcome.status == 201, f"expected 201, got {outcome.status}")
        again = self.post(key, body)
        replayed = again.header("Idempotent-Replayed")
        shown = f"{again.status}, Idempotent-Replayed: {replayed}, id {_id(again)}"
        self.say(f"duplicate once it finished -> {shown}")
        self.expect(again.status == 201 and replayed == "true", "expected a replayed 201")
        self.expect(_id(again) == _id(outcome), "expected the first request's charge")

    def missing_key(self) -> None:
        self.say(f"POST /charges {json.dumps(self.BODY)}  (no Idempotency-Key)")
        answer = self.post(None, self.BODY)
        self.say(f"-> {answer.status} {_code(answer)}")
        self.expect(answer.status == 400, f"expected 400, got {answer.status}: {answer.body}")

    def final_count(self) -> None:
        listing = self.client.charges()
        ids = ", ".join(c["id"] for c in listing["charges"])
        self.say(f"GET /charges -> {listing['count']} charges: {ids}")
        self.expect(listing["count"] == 3, f"expected exactly 3 charges, found {listing['count']}")
        self.say(f"three payments, {self.posts} operations: each payment charged exactly once")

    def play(self) -> bool:
        self.step(
            1,
            "A first attempt: the client times out, the server charges anyway",
            self.timeout_then_charged,
        )
        self.step(2, "The client retries with the same key", self.retry_replays)
        self.step(3, "The same key with an edited amount", self.edited_body_rejected)
        self.step(4, "A duplicate arrives while the first request runs", self.duplicate_in_flight)
        self.step(5, "A request without a key", self.missing_key)
        self.step(
            6, "idemkey.client: timeouts and 409s retried to one charge", self.client_does_it_all
        )
        self.step(7, "How many charges were made?", self.final_count)
        return all(step.ok for step in self.steps)


def _id(answer: Answer) -> str:
    return str(answer.body.get("id", "?")) if isinstance(answer.body, dict) else "?"


def _from_reply(reply: IdempotentResponse) -> Answer:
    try:
        body: Any = reply.json()
    except ValueError:
        body = reply.content.decode("utf-8", "replace")
    return Answer(reply.status_code, {k.lower(): v for k, v in reply.headers.items()}, body)


def _code(answer: Answer) -> str:
    return str(answer.body.get("code", "")) if isinstance(answer.body, dict) else ""


def run_story(
    redis_url: str | None = None,
    prefix: str = "idemkey",
    out: IO[str] | None = None,
    *,
    as_json: bool = False,
) -> bool:
    """Start the demo app on a local port and play the retry story; True when every step
    behaved. ``redis_url`` None: an embedded fakeredis server."""
    out = out if out is not None else sys.stdout
    store, where, close = open_store(redis_url, prefix)
    try:
        app = create_app(store)
        with running(app) as base:
            if not as_json:
                out.write(f"idemkey demo: payments app on {base}\nstore: {where}\n")
            story = Story(Client(base), None if as_json else out, uuid.uuid4().hex[:8])
            started = time.monotonic()
            ok = story.play()
            elapsed = time.monotonic() - started
    finally:
        close()
    if as_json:
        steps = [
            {"step": s.number, "title": s.title, "ok": s.ok, "lines": s.lines} for s in story.steps
        ]
        json.dump(
            {"ok": ok, "store": where, "seconds": round(elapsed, 2), "steps": steps}, out, indent=2
        )
        out.write("\n")
    else:
        failed = [s.number for s in story.steps if not s.ok]
        verdict = "every step behaved" if ok else f"steps {failed} did NOT behave"
        out.write(f"\n{verdict} ({elapsed:.1f} s)\n")
    return ok
