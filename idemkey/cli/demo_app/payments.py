"""The demo's payment rules, free of any framework: shared by the Flask and the ASGI app.

``POST /charges`` takes ``{"amount": 1000, "currency": "eur"}`` and makes a charge. A
``Demo-Delay: <seconds>`` header (0 to 5) makes the payment processor slow, so the story can
show a client timeout and a duplicate arriving while the first request runs. The delay is a
header, not a query parameter, because the query is part of the request fingerprint and the
delay is not part of the payment. The tenant scope is the ``Account`` header (default
``acct_demo``): the same key sent by two accounts makes two charges, as it must.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ...policy import Policy

if TYPE_CHECKING:
    from ...http import Request

__all__ = [
    "CURRENCIES",
    "DEFAULT_ACCOUNT",
    "MAX_DELAY",
    "Ledger",
    "Problem",
    "account_scope",
    "demo_policy",
    "parse_charge",
    "parse_delay",
]

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


@dataclass(frozen=True, slots=True)
class Problem:
    """An RFC 9457 problem answer for a request the demo refuses."""

    status: int
    code: str
    detail: str

    def body(self) -> bytes:
        doc = {"type": f"urn:idemkey-demo:{self.code}", "title": self.detail}
        return json.dumps({**doc, "status": self.status, "code": self.code}).encode()


def parse_charge(data: object) -> tuple[int, str] | Problem:
    """``(amount, currency)`` from a decoded JSON body, or the problem with it."""
    if not isinstance(data, dict):
        return Problem(400, "bad_json", 'send a JSON object like {"amount": 1000, ...}')
    amount, currency = data.get("amount"), data.get("currency")
    if type(amount) is not int or not 0 < amount <= 100_000_000:
        return Problem(400, "bad_amount", "amount must be an integer of minor units > 0")
    if not isinstance(currency, str) or currency.lower() not in CURRENCIES:
        return Problem(400, "bad_currency", f"currency must be one of {sorted(CURRENCIES)}")
    return amount, currency.lower()


def parse_delay(header: str | None) -> float | Problem:
    """The ``Demo-Delay`` header in seconds (0 when absent), or the problem with it."""
    try:
        delay = float(header or "0")
    except ValueError:
        delay = -1.0
    if not 0 <= delay <= MAX_DELAY:  # also refuses nan
        return Problem(400, "bad_delay", f"Demo-Delay must be 0 to {MAX_DELAY:g} seconds")
    return delay


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

    def begin(self) -> None:
        with self.lock:
            self.processing += 1

    def end(self) -> None:
        with self.lock:
            self.processing -= 1

    def listing(self) -> dict[str, Any]:
        with self.lock:
            charges = list(self.charges)
            return {"count": len(charges), "processing": self.processing, "charges": charges}

    def find(self, charge_id: str) -> dict[str, Any] | None:
        with self.lock:
            return next((c for c in self.charges if c["id"] == charge_id), None)
