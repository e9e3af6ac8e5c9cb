"""The demo payments app, and the retry story ``idemkey demo`` plays against it over real HTTP.

The app is a small Flask service guarded by :class:`idemkey.adapters.flask.Idemkey`::

    POST /charges        {"amount": 1000, "currency": "eur"}  -> 201 {"id": "ch_...", ...}
    GET  /charges        {"count": n, "processing": k, "charges": [...]}
    GET  /charges/<id>   one charge

``POST /charges`` needs an ``Idempotency-Key``. A ``Demo-Delay: <seconds>`` header (0 to 5)
makes the payment processor slow, so the story can show a client timeout and a duplicate
arriving while the first request runs. The delay is a header, not a query parameter, because
the query is part of the request fingerprint and the delay is not part of the payment.
The tenant scope is the ``Account`` header (default ``acct_demo``): the same key sent by two
accounts makes two charges, as it must.

Charges live in process memory: the demo shows the records, not a ledger.
"""

from __future__ import annotations

import http.client
import json
import secrets
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Final

from .policy import Policy
from .store import RedisStore

if TYPE_CHECKING:
    from flask import Flask
    from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler

    from .http import Request

__all__ = ["Ledger", "create_app", "demo_policy", "open_store", "run_story", "serve"]

MAX_DELAY: Final = 5.0
DEFAULT_ACCOUNT: Final = "acct_demo"
CURRENCIES: Final = frozenset({"eur", "usd", "gbp", "chf", "jpy"})


def account_scope(request: Request) -> str:
    """The demo's tenant: the ``Account`` header. Real apps use the authenticated account."""
    return request.headers.get("account", DEFAULT_ACCOUNT)


def demo_policy(prefix: str = "idemkey") -> Policy:
    """The demo's policy: scoped by account; records kept 10 minutes, not 24 h, so a demo run
    against a real server does not leave records behind for a day."""
    return Policy(prefix=prefix, scope=account_scope, ttl=600.0, lease=10.0)


@dataclass
class Ledger:
    """The demo's payment processor: charges in memory, and how many are being made now."""

    charges: list[dict[str, Any]] = field(default_factory=list)
    processing: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def charge(self, account: str, amount: int, currency: str) -> dict[str, Any]:
        charge = {
            "id": "ch_" + secrets.token_hex(8),
            "account": account,
            "amount": amount,
            "currency": currency,
            "created": round(time.time(), 3),
        }
        with self.lock:
            self.charges.append(charge)
        return charge


def _problem(status: int, code: str, detail: str) -> tuple[str, int, dict[str, str]]:
    body = {"type": f"urn:idemkey-demo:{code}", "title": detail, "status": status, "code": code}
    return json.dumps(body), status, {"Content-Type": "application/problem+json"}


def create_app(store: RedisStore, policy: Policy | None = None) -> Flask:
    """The demo payments app over ``store``; ``app.extensions["ledger"]`` holds the charges."""
    from flask import Flask, jsonify, request

    from .adapters.flask import Idemkey

    app = Flask("idemkey.demo")
    ledger = Ledger()
    app.extensions["ledger"] = ledger
    idem = Idemkey(app, store=store, policy=policy or store.policy)

    @app.post("/charges")
    @idem.idempotent
    def create_charge() -> Any:
        data = request.get_json(silent=True)
        if not isinstance(data, dict):
            return _problem(400, "bad_json", 'send a JSON object like {"amount": 1000, ...}')
        amount, currency = data.get("amount"), data.get("currency")
        if type(amount) is not int or not 0 < amount <= 100_000_000:
            return _problem(400, "bad_amount", "amount must be an integer of minor units > 0")
        if not isinstance(currency, str) or currency.lower() not in CURRENCIES:
            return _problem(400, "bad_currency", f"currency must be one of {sorted(CURRENCIES)}")
        try:
            delay = float(request.headers.get("Demo-Delay", "0"))
        except ValueError:
            delay = -1.0
        if not 0 <= delay <= MAX_DELAY:
            return _problem(400, "bad_delay", f"Demo-Delay must be 0 to {MAX_DELAY:g} seconds")
        with ledger.lock:
            ledger.processing += 1
        try:
            time.sleep(delay)  # the slow payment processor the story needs
            charge = ledger.charge(
                request.headers.get("Account", DEFAULT_ACCOUNT), amount, currency.lower()
            )
        finally:
            with ledger.lock:
                ledger.processing -= 1
        response = jsonify(charge)
        response.status_code = 201
        response.headers["Location"] = f"/charges/{charge['id']}"
        return response

    @app.get("/charges")
    def list_charges() -> Any:
        with ledger.lock:
            charges = list(ledger.charges)
            processing = ledger.processing
        return jsonify(count=len(charges), processing=processing, charges=charges)

    @app.get("/charges/<charge_id>")
    def get_charge(charge_id: str) -> Any:
        with ledger.lock:
            found = [c for c in ledger.charges if c["id"] == charge_id]
        if not found:
            return _problem(404, "not_found", f"no charge {charge_id}")
        return jsonify(found[0])

    return app


def open_store(redis_url: str | None, prefix: str) -> tuple[RedisStore, str, Callable[[], None]]:
    """A store on ``redis_url``, or on an embedded fakeredis server (with Lua) when None.

    Returns the store, a description of where it is, and a function that closes it.
    """
    policy = demo_policy(prefix)
    if redis_url:
        import redis

        from .cli import redact

        client = redis.Redis.from_url(redis_url, socket_connect_timeout=3, socket_timeout=10)
        client.ping()  # fail now, with one line, rather than inside the first request
        where = redact(redis_url)
    else:
        try:
            import fakeredis
        except ImportError:
            from .cli import CliError

            raise CliError(
                "the embedded store needs fakeredis[lua]: pip install 'idemkey[demo]', "
                "or pass --redis-url",
                2,
            ) from None
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=False)
        where = "embedded fakeredis (Lua scripts, in this process)"
    store = RedisStore(client, policy)

    def close() -> None:
        store.close()
        client.close()

    return store, where, close


@contextmanager
def running(
    app: Flask, host: str = "127.0.0.1", port: int = 0, quiet: bool = True
) -> Iterator[str]:
    """Serve ``app`` on a real port in a thread (threaded server); yields its base URL."""
    from werkzeug.serving import WSGIRequestHandler

    class Quiet(WSGIRequestHandler):
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            pass

    server = _make_server(host, port, app, Quiet if quiet else None)
    thread = threading.Thread(target=server.serve_forever, name="idemkey-demo", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.socket.getsockname()[1]}"
    finally:
        server.shutdown()
        thread.join(5)
        server.server_close()


def _make_server(
    host: str, port: int, app: Flask, handler: type[WSGIRequestHandler] | None = None
) -> BaseWSGIServer:
    """A threaded werkzeug server on a socket we bind ourselves.

    werkzeug prints a message and calls ``sys.exit(1)`` when it cannot bind; binding first
    turns a busy port into one clear line.
    """
    from werkzeug.serving import make_server

    from .cli import CliError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        listener = socket.create_server((host, port), family=family)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    with listener:  # werkzeug works on a duplicate of the descriptor
        return make_server(
            host, port, app, threaded=True, request_handler=handler, fd=listener.fileno()
        )


# --------------------------------------------------------------------------------------------
# The story
# --------------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: Mapping[str, str]
    body: Any  # parsed JSON, or the raw text

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


class Client:
    """A tiny HTTP client for the story: one connection per request, JSON in and out."""

    def __init__(self, base: str) -> None:
        host, _, port = base.removeprefix("http://").partition(":")
        self.host, self.port = host, int(port)

    def request(
        self,
        method: str,
        path: str,
        body: object = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
    ) -> Answer:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            payload = None if body is None else json.dumps(body).encode()
            sent = {"Content-Type": "application/json"} if payload is not None else {}
            connection.request(method, path, body=payload, headers={**sent, **(headers or {})})
            response = connection.getresponse()
            raw = response.read()
            answer_headers = {k.lower(): v for k, v in response.getheaders()}
        finally:
            connection.close()
        try:
            parsed: Any = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode("utf-8", "replace")
        return Answer(response.status, answer_headers, parsed)

    def charges(self) -> dict[str, Any]:
        listing: dict[str, Any] = self.request("GET", "/charges").body
        return listing


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

    def post_honouring_retry_after(self, key: str, body: object) -> Answer:
        """A well-behaved client: on 409 it waits Retry-After seconds and sends it again."""
        answer = self.post(key, body)
        for _ in range(5):
            if answer.status != 409:
                break
            wait = float(answer.header("Retry-After") or 1)
            self.say(f"409 (the first attempt is still finishing): retrying in {wait:g} s")
            time.sleep(wait)
            answer = self.post(key, body)
        return answer

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
        self.say(f"POST /charges {json.dumps(self.BODY)}  Idempotency-Key: {key}  (same key)")
        answer = self.post_honouring_retry_after(key, self.BODY)
        replayed = answer.header("Idempotent-Replayed")
        self.say(f"-> {answer.status}, Idempotent-Replayed: {replayed or '-'}, id {_id(answer)}")
        self.expect(answer.status == 201, f"expected 201, got {answer.status}: {answer.body}")
        self.expect(replayed == "true", "expected the header Idempotent-Replayed: true")
        self.expect(_id(answer) == self.first_charge, f"expected charge {self.first_charge}")
        count = self.client.charges()["count"]
        self.say(f"the same charge as the one the timed-out attempt made; charges: {count}")
        self.expect(count == 1, f"expected 1 charge, found {count}")

    def edited_body_rejected(self) -> None:
        key = self.key("order-1")
        edited = {**self.BODY, "amount": 2000}
        self.say(f"POST /charges {json.dumps(edited)}  Idempotency-Key: {key}  (edited amount)")
        answer = self.post(key, edited)
        self.say(f"-> {answer.status} {_code(answer)}")
        self.expect(answer.status == 422, f"expected 422, got {answer.status}: {answer.body}")
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
        self.expect(listing["count"] == 2, f"expected exactly 2 charges, found {listing['count']}")
        self.say(f"two payments, {self.posts} POSTs: each payment charged exactly once")

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
        self.step(6, "How many charges were made?", self.final_count)
        return all(step.ok for step in self.steps)


def _id(answer: Answer) -> str:
    return str(answer.body.get("id", "?")) if isinstance(answer.body, dict) else "?"


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


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    redis_url: str | None = None,
    prefix: str = "idemkey",
    out: IO[str] | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Run the demo app until interrupted, printing curl commands to try it."""
    out = out if out is not None else sys.stdout
    store, where, close = open_store(redis_url, prefix)
    try:
        server = _make_server(host, port, create_app(store))
        base = f"http://{host}:{server.socket.getsockname()[1]}"
        key = "order-" + secrets.token_hex(3)
        out.write(
            f"idemkey demo app on {base} (store: {where}); Ctrl-C stops it\n\n"
            f"  curl -i -X POST {base}/charges -H 'Idempotency-Key: {key}' \\\n"
            "       -H 'Content-Type: application/json' "
            """-d '{"amount": 1000, "currency": "eur"}'\n"""
            "  # the same again: the stored 201, Idempotent-Replayed: true, no new charge\n"
            "  # -d with another amount: 422; add -H 'Demo-Delay: 5' and send twice: 409\n"
            f"  curl -s {base}/charges\n"
            + (
                f"  idemkey inspect {key} --scope {DEFAULT_ACCOUNT} --route /charges "
                f"--redis-url {where}"
                if redis_url
                else "  # `idemkey inspect` needs a real Redis: start the app with --redis-url"
            )
            + "\n\n"
        )
        out.flush()
        if ready is not None:
            ready(base)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    finally:
        close()
