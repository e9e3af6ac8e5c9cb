"""The story's plain HTTP client: one connection per request, JSON in and out.

It plays the naive first attempt (a client that gives up) and reads the app's ledger; every
retry in the story goes through :mod:`idemkey.client`.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Answer", "Client", "json_bytes"]


@dataclass
class Answer:
    status: int
    headers: Mapping[str, str]
    body: Any  # parsed JSON, or the raw text

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


def json_bytes(body: object) -> bytes:
    """The demo's JSON bodies, byte for byte the same on the first attempt (http.client) and the
    retry (idemkey.client): not left to httpx, whose ``json=`` wrote spaces before 0.28."""
    return json.dumps(body, separators=(",", ":")).encode()


class Client:
    """A tiny HTTP client for the story: one connection per request, JSON in and out."""

    def __init__(self, base: str) -> None:
        self.base = base
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
            # The story's retry through idemkey.client sends these same bytes (json_bytes).
            payload = None if body is None else json_bytes(body)
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
