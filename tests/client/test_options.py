"""Every option of the client's constructors is checked where it arrives, by the field's name.

A bare string where a collection belongs, an unknown or ill-typed option and a negative
duration are a ``ConfigurationError`` that says which constructor and which field, at
construction; never a string split into letters (``methods="POST"`` was ``{'P','O','S','T'}``,
and the transport then sent no key at all), nor a TypeError or a socket error at the first call.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator

import httpx
import pytest

from idemkey.client import (
    AsyncClient,
    AsyncIdempotentTransport,
    Client,
    IdempotentTransport,
    RetryPolicy,
)
from idemkey.errors import ConfigurationError

from ._slow_server import SlowServer


async def async_hook(_: object) -> None:
    """An async app writes its hooks async: called synchronously, its coroutine never ran."""


class AsyncCall:
    async def __call__(self, _: object) -> None: ...


NOT_ASYNC = "expected a plain (not async) callable"

BAD: list[tuple[str, Callable[[], object], str]] = [
    # (id, the constructor call as a user types it, the start of the message)
    ("transport-methods-str", lambda: IdempotentTransport(methods="POST"),
     "IdempotentTransport(methods=...): expected a collection of method names, got the string "
     "'POST'"),
    ("async-transport-methods-str", lambda: AsyncIdempotentTransport(methods="POST"),
     "AsyncIdempotentTransport(methods=...): expected a collection of method names, got the "
     "string 'POST'"),
    ("transport-methods-empty", lambda: IdempotentTransport(methods=()),
     "IdempotentTransport(methods=...): expected a collection of method names (at least one)"),
    ("transport-methods-not-names", lambda: IdempotentTransport(methods=["POST", 1]),
     "IdempotentTransport(methods=...): expected a collection of method names, each a token"),
    ("transport-methods-space", lambda: IdempotentTransport(methods=["PO ST"]),
     "IdempotentTransport(methods=...): expected a collection of method names, each a token"),
    ("transport-header", lambda: IdempotentTransport(header="Idempotency Key"),
     "IdempotentTransport(header=...): expected a header name"),
    ("transport-retry", lambda: IdempotentTransport(retry={"deadline": 3}),
     "IdempotentTransport(retry=...): expected a RetryPolicy, got dict"),
    ("transport-hook", lambda: IdempotentTransport(on_retry="print"),
     "IdempotentTransport(on_retry=...): expected a callable or None, got the string 'print'"),
    ("transport-inner", lambda: IdempotentTransport(httpx.HTTPTransport),
     "IdempotentTransport(transport=...): expected an httpx.BaseTransport"),
    ("transport-unknown", lambda: IdempotentTransport(retries=3),
     "IdempotentTransport(retries=...): not an option; the options are transport, retry"),
    ("async-transport-unknown", lambda: AsyncIdempotentTransport(method=["POST"]),
     "AsyncIdempotentTransport(method=...): not an option"),
    ("client-unknown", lambda: Client(base_url="http://api.test", timout=2.0),
     "Client(timout=...): not an option of Client nor of httpx.Client"),
    ("async-client-unknown", lambda: AsyncClient(base_url="http://api.test", retries=3),
     "AsyncClient(retries=...): not an option of AsyncClient nor of httpx.AsyncClient"),
    ("client-timeout-negative", lambda: Client(base_url="http://api.test", timeout=-1),
     "Client(timeout=...): expected seconds >= 0, None or an httpx.Timeout, got -1"),
    ("async-client-timeout-negative",
     lambda: AsyncClient(timeout=httpx.Timeout(5.0, connect=-2.0)),
     "AsyncClient(timeout=...): expected seconds >= 0"),
    ("client-timeout-str", lambda: Client(timeout="2"),
     "Client(timeout=...): expected seconds >= 0, None or an httpx.Timeout, got the string '2'"),
    ("client-header", lambda: Client(header=""), "Client(header=...): expected a header name"),
    ("client-retry-class", lambda: Client(retry=RetryPolicy),
     "Client(retry=...): expected a RetryPolicy, got the class RetryPolicy"),
    ("client-wrong-http", lambda: Client(httpx.AsyncClient()),
     "Client(http=...): expected an httpx.Client or None, got AsyncClient"),
    ("client-http-and-options", lambda: Client(httpx.Client(), base_url="http://api.test"),
     "Client(http=..., base_url=...): pass an httpx.Client or httpx options, not both"),
    # An async hook: the client calls it synchronously, so its check never ran (stop 53 refused
    # an async on_event and render_problem the same way).
    ("async-client-on-replay-async", lambda: AsyncClient(on_replay=async_hook),
     f"AsyncClient(on_replay=...): {NOT_ASYNC}"),
    ("client-on-replay-async", lambda: Client(on_replay=async_hook),
     f"Client(on_replay=...): {NOT_ASYNC}"),
    ("async-client-on-replay-async-call", lambda: AsyncClient(on_replay=AsyncCall()),
     f"AsyncClient(on_replay=...): {NOT_ASYNC}"),
    ("async-client-on-retry-async", lambda: AsyncClient(on_retry=async_hook),
     f"AsyncClient(on_retry=...): {NOT_ASYNC}"),
    ("client-on-retry-async-call", lambda: Client(on_retry=AsyncCall()),
     f"Client(on_retry=...): {NOT_ASYNC}"),
    ("async-transport-on-retry-async", lambda: AsyncIdempotentTransport(on_retry=async_hook),
     f"AsyncIdempotentTransport(on_retry=...): {NOT_ASYNC}"),
    # httpx's own options, each by what httpx makes of it: a raw TypeError, AttributeError or
    # IndexError from inside httpx, or accepted and failing at the first call (or never).
    ("client-timeout-short-tuple", lambda: Client(timeout=(1,)),
     "Client(timeout=...): expected seconds >= 0, None or an httpx.Timeout, got tuple (1,)"),
    ("client-base-url-int", lambda: Client(base_url=123),
     "Client(base_url=...): expected a URL (a str or an httpx.URL), got 123"),
    ("client-headers-int", lambda: Client(headers=5),
     "Client(headers=...): expected headers (a mapping or a list of pairs), got 5"),
    ("client-headers-value", lambda: Client(headers={"X-Id": 5}),
     "Client(headers=...): expected headers (a mapping or a list of pairs), got dict"),
    ("client-params-int", lambda: Client(params=5),
     "Client(params=...): expected query parameters (a mapping, a list of pairs or a str), "
     "got 5"),
    ("client-cookies-int", lambda: Client(cookies=5),
     "Client(cookies=...): expected cookies (a dict, a list of pairs, httpx.Cookies or a "
     "CookieJar), got 5"),
    ("client-limits-str", lambda: Client(limits="x"),
     "Client(limits=...): expected an httpx.Limits, got the string 'x'"),
    ("client-max-redirects-negative", lambda: Client(max_redirects=-1),
     "Client(max_redirects=...): expected a whole number >= 0, got -1"),
    ("client-follow-redirects-str", lambda: Client(follow_redirects="no"),
     "Client(follow_redirects=...): expected True or False, got the string 'no'"),
    ("client-transport-int", lambda: Client(transport=5),
     "Client(transport=...): expected an httpx.BaseTransport or None, got 5"),
    ("client-transport-async", lambda: Client(transport=httpx.AsyncHTTPTransport()),
     "Client(transport=...): expected an httpx.BaseTransport or None, got AsyncHTTPTransport"),
    ("async-client-transport-sync", lambda: AsyncClient(transport=httpx.HTTPTransport()),
     "AsyncClient(transport=...): expected an httpx.AsyncBaseTransport or None, got "
     "HTTPTransport"),
    ("client-mounts", lambda: Client(mounts={"http://": 5}),
     "Client(mounts=...): expected a mapping of URL patterns to an httpx.BaseTransport or "
     "None, got dict"),
    ("client-auth-int", lambda: Client(auth=5),
     "Client(auth=...): expected an httpx.Auth, a (username, password) tuple or a callable, "
     "got 5"),
    ("client-event-hooks", lambda: Client(event_hooks={"request": 5}),
     "Client(event_hooks=...): expected a mapping of 'request' and 'response' to lists of "
     "callables, got dict"),
    ("client-event-hooks-typo", lambda: Client(event_hooks={"requests": [print]}),
     "Client(event_hooks=...): expected a mapping of 'request' and 'response' to lists of "
     "callables, got dict"),
    ("client-proxy-int", lambda: Client(proxy=5),
     "Client(proxy=...): expected a proxy URL (a str, an httpx.URL or an httpx.Proxy), got 5"),
    ("client-proxy-scheme", lambda: Client(proxy="ftp://proxy.test"),
     "Client(proxy=...): expected a proxy URL (a str, an httpx.URL or an httpx.Proxy), got str "
     "(not shown: it may hold credentials)"),
    ("client-verify-int", lambda: Client(verify=5),
     "Client(verify=...): expected True, False, a CA bundle path or an ssl.SSLContext, got 5"),
    ("client-cert-int", lambda: Client(cert=5),
     "Client(cert=...): expected a certificate file or a (certfile, keyfile[, password]) "
     "tuple, got 5"),
    ("client-default-encoding", lambda: Client(default_encoding=5),
     "Client(default_encoding=...): expected an encoding name or a callable, got 5"),
    ("retry-unknown", lambda: RetryPolicy(bogus=1),
     "RetryPolicy(bogus=...): not an option; the options are max_attempts, deadline"),
    ("retry-typo", lambda: RetryPolicy(max_attempt=3),
     "RetryPolicy(max_attempt=...): not an option; did you mean max_attempts=?"),
    ("retry-positional", lambda: RetryPolicy(8, 60.0, 0.25, 8.0, 0.5, frozenset(), 7),
     "RetryPolicy takes at most 6 positional arguments"),
    ("retry-twice", lambda: RetryPolicy(3, max_attempts=4),
     "RetryPolicy: max_attempts given twice"),
    ("deadline-negative", lambda: RetryPolicy(deadline=-1),
     "RetryPolicy(deadline=...): expected finite seconds > 0, got -1"),
    ("deadline-zero", lambda: RetryPolicy(deadline=0),
     "RetryPolicy(deadline=...): expected finite seconds > 0, got 0"),
    ("deadline-str", lambda: RetryPolicy(deadline="3"),
     "RetryPolicy(deadline=...): expected finite seconds > 0, got the string '3'"),
    ("deadline-nan", lambda: RetryPolicy(deadline=math.nan),
     "RetryPolicy(deadline=...): expected finite seconds > 0, got nan"),
    ("deadline-inf", lambda: RetryPolicy(deadline=math.inf),
     "RetryPolicy(deadline=...): expected finite seconds > 0, got inf"),
    ("backoff-negative", lambda: RetryPolicy(backoff=-0.25),
     "RetryPolicy(backoff=...): expected finite seconds >= 0, got -0.25"),
    ("backoff-cap-negative", lambda: RetryPolicy(backoff=0, backoff_cap=-1),
     "RetryPolicy(backoff_cap=...): expected finite seconds >= 0, got -1"),
    ("backoff-cap-below", lambda: RetryPolicy(backoff=2, backoff_cap=1),
     "RetryPolicy(backoff_cap=...): expected seconds >= backoff (2), got 1.0"),
    ("attempts-zero", lambda: RetryPolicy(max_attempts=0),
     "RetryPolicy(max_attempts=...): expected a whole number >= 1, got 0"),
    ("attempts-float", lambda: RetryPolicy(max_attempts=2.5),
     "RetryPolicy(max_attempts=...): expected a whole number >= 1, got 2.5"),
    ("jitter", lambda: RetryPolicy(jitter=1.5),
     "RetryPolicy(jitter=...): expected a fraction between 0 and 1, got 1.5"),
    ("statuses-int", lambda: RetryPolicy(retry_statuses=503),
     "RetryPolicy(retry_statuses=...): expected a collection of HTTP status codes, got 503"),
    ("statuses-str", lambda: RetryPolicy(retry_statuses="503"),
     "RetryPolicy(retry_statuses=...): expected a collection of HTTP status codes, got the "
     "string '503'"),
    ("statuses-range", lambda: RetryPolicy(retry_statuses=[503, 5030]),
     "RetryPolicy(retry_statuses=...): expected a collection of HTTP status codes, each an int"),
    ("statuses-4xx", lambda: RetryPolicy(retry_statuses=[503, 422]),
     "RetryPolicy(retry_statuses=...): expected no 4xx but 408, 425 and 429, got list [422]"),
]  # fmt: skip


#: Options that may hold credentials, each refused; its message must not show them.
SECRETS = [
    ("auth-list", {"auth": ["payments", "s3cr3t-pw"]}, "got list"),
    ("headers-bad-value", {"headers": {"Authorization": "Bearer sk_live_abc", "X-Retries": 3}},
     "the header 'X-Retries' has a value of type int"),
    ("headers-bad-pair", {"headers": [("Authorization", "Bearer sk_live_abc"), ("X",)]},
     "an item is tuple, not a (name, value) pair"),
    ("cookies-str", {"cookies": "session=sess_abc"}, "got str"),
    ("cookies-bad-pair", {"cookies": [("session", "sess_abc", "x")]}, "got list"),
    ("cert-list", {"cert": ["client.pem", "s3cr3t-pw"]}, "got list"),
    ("proxy-scheme", {"proxy": "ftp://u:s3cr3t-pw@proxy.test"}, "got str"),
    ("base-url-port", {"base_url": "https://u:s3cr3t-pw@api.test:x"}, "got str"),
    ("params-bad", {"params": [("api_key", "sk_live_abc"), 5]}, "got list"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("options", "shows"), [case[1:] for case in SECRETS], ids=[case[0] for case in SECRETS]
)
def test_a_refused_credential_is_never_shown(options: dict[str, object], shows: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        Client(**options)
    message = str(refused.value)
    assert shows in message
    for secret in ("s3cr3t-pw", "sk_live_abc", "sess_abc"):
        assert secret not in message
        assert secret not in repr(refused.value.__cause__)


@pytest.mark.parametrize(("make", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_option_is_refused_by_name(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ConfigurationError, match="^" + re.escape(message)):
        make()


def test_collections_are_converted_once() -> None:
    policy = RetryPolicy(retry_statuses=[503, 429])
    assert policy.retry_statuses == frozenset({503, 429})
    assert hash(policy)  # a value: shareable across clients
    assert IdempotentTransport(methods=["post", "put"]).methods == frozenset({"POST", "PUT"})


@pytest.fixture
def server() -> Iterator[SlowServer]:
    with SlowServer("fast") as running:
        yield running


def test_the_methods_given_are_the_ones_keyed(server: SlowServer) -> None:
    """Through a real server: ``methods=["put"]`` keys a PUT, and leaves a POST alone."""
    transport = IdempotentTransport(methods=["put"])
    with httpx.Client(base_url=server.url, transport=transport) as http:
        http.put("/charges/1", json={"amount": 1})
        http.post("/charges", json={"amount": 1})
    put, post = server.seen
    assert "idempotency-key" in put
    assert "idempotency-key" not in post


PREPARE_BAD = [(-1, "got -1"), (math.nan, "got nan"), ("2", "got the string '2'"),
               (httpx.Timeout(5.0, connect=-1.0), "got Timeout Timeout("),
               ((1,), "got tuple (1,)")]  # fmt: skip


@pytest.mark.parametrize(
    ("timeout", "got"), PREPARE_BAD, ids=["-1", "nan", "str", "connect", "short-tuple"]
)
async def test_prepare_checks_its_timeout_as_the_constructor_does(
    server: SlowServer, timeout: object, got: str
) -> None:
    """``prepare(timeout=-1)`` was a bare ValueError in Client, and in AsyncClient spent the
    whole deadline retrying "connect" without reaching the server."""
    expected = "prepare(timeout=...): expected seconds >= 0, None or an httpx.Timeout, " + got
    with Client(base_url=server.url) as client:
        with pytest.raises(ConfigurationError, match="^Client." + re.escape(expected)):
            client.prepare("POST", "/charges", json={}, timeout=timeout)
        # What Client(timeout=...) takes, prepare takes too.
        for good in (None, 2.0, httpx.Timeout(2.0), (2.0, 2.0, 2.0, 2.0), httpx.USE_CLIENT_DEFAULT):
            client.send(client.prepare("POST", "/charges", json={}, timeout=good))
    async with AsyncClient(base_url=server.url) as aclient:
        with pytest.raises(ConfigurationError, match="^AsyncClient." + re.escape(expected)):
            aclient.prepare("POST", "/charges", json={}, timeout=timeout)
    assert len(server.seen) == 5  # the good ones only


GOOD_HTTP_OPTIONS: list[dict[str, object]] = [
    {"base_url": httpx.URL("http://api.test"), "headers": [("X-Id", "1")], "params": "a=1"},
    {"cookies": {"session": "1"}, "auth": ("user", "password"), "max_redirects": 0},
    {"limits": httpx.Limits(max_connections=1), "follow_redirects": True, "trust_env": False},
    {"mounts": {"http://other.test": None}, "event_hooks": {"request": [], "response": []}},
    {"proxy": "http://proxy.test:3128", "verify": False, "default_encoding": "latin-1"},
    {"http1": True, "http2": False, "timeout": (1.0, 2.0, 3.0, 4.0), "auth": None},
]


@pytest.mark.parametrize("options", GOOD_HTTP_OPTIONS)
async def test_what_httpx_takes_is_taken(options: dict[str, object]) -> None:
    with Client(**options):
        pass
    async with AsyncClient(**options):
        pass
