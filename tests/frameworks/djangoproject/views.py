"""Views of the test project. Runs are counted in Redis (INCR), so a test sees them across
server processes: ``{prefix}:runs:{view}``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from idemkey.adapters.django import idempotency_exempt, idempotent


@dataclass(frozen=True)
class User:
    pk: str
    is_authenticated: bool = True


class TokenUserMiddleware:
    """``Authorization: Token <name>[:<session>]`` makes ``request.user`` that user (no
    database); two sessions of one user are two credentials of the same user."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = request.headers.get("Authorization", "")
        name = token.removeprefix("Token ").split(":")[0] if token.startswith("Token ") else ""
        request.user = User(name) if name else User("", is_authenticated=False)  # type: ignore[assignment]
        return self.get_response(request)


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def _run(name: str) -> int:
    client = _redis()
    try:
        return int(client.incr(f"{settings.IDEMKEY['PREFIX']}:runs:{name}"))
    finally:
        client.close()


def health(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@idempotent
def charges(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return JsonResponse({"error": "POST only"}, status=405)
    run = _run("charges")
    amount = json.loads(request.body)["amount"]
    return JsonResponse({"id": f"ch_{run}", "amount": amount, "user": request.user.pk}, status=201)


@idempotent
def reasoned(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"charged", status=201, reason="Charged OK")


@idempotent
def capture(request: HttpRequest, charge_id: int) -> HttpResponse:
    """No Redis of its own: the label test sends it a thousand paths."""
    return HttpResponse(b"ok", status=201)


@idempotent
async def async_charges(request: HttpRequest) -> HttpResponse:
    """An async view: Django must still see a coroutine function behind the decorator."""
    return JsonResponse({"async": True, "body": request.body.decode()}, status=201)


@idempotent(required=False, ttl=3600)
def refund(request: HttpRequest, charge_id: int) -> HttpResponse:
    run = _run("refund")
    return JsonResponse({"refund": charge_id, "run": run})


def login(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"run": _run("login"), "body": request.body.decode()})


@idempotency_exempt
def webhook(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"run": _run("webhook")})


def _form(request: HttpRequest, name: str) -> HttpResponse:
    """What the form carried: its amount, and its receipt's size (None without a file)."""
    run = _run(name)
    receipt = request.FILES.get("receipt")
    size = len(receipt.read()) if receipt is not None else None
    return JsonResponse(
        {"run": run, "amount": request.POST.get("amount"), "receipt": size}, status=201
    )


@idempotent
def forms(request: HttpRequest) -> HttpResponse:
    """A browser's form (multipart or urlencoded): CSRF-protected where CsrfViewMiddleware is
    listed (never ``csrf_exempt``), read as ``request.POST`` and ``request.FILES``."""
    return _form(request, "forms")


@idempotent(header="Request-Id", max_request_bytes=2_000_000)
def forms_by_request_id(request: HttpRequest) -> HttpResponse:
    """The same form, keyed by another header (with a larger limit): the middleware must know
    it before the URLconf is loaded by the first request."""
    return _form(request, "forms-by-request-id")


@idempotent
def slow(request: HttpRequest) -> HttpResponse:
    """Waits (10 s at most) until the test sets ``{prefix}:gate``; marks ``{prefix}:started``."""
    run = _run("slow")
    prefix: str = settings.IDEMKEY["PREFIX"]
    client = _redis()
    try:
        client.set(f"{prefix}:started", 1)
        deadline = time.monotonic() + 10
        while not client.exists(f"{prefix}:gate") and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        client.close()
    return JsonResponse({"run": run})
