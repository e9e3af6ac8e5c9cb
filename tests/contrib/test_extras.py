"""A metrics hook whose library is missing names the extra that installs it."""

from __future__ import annotations

import sys

import pytest

from idemkey.contrib.otel import otel_hook
from idemkey.contrib.prometheus import prometheus_hook


def test_prometheus_hook_without_prometheus_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'idemkey-redis\[prometheus\]'"):
        prometheus_hook()


def test_otel_hook_without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match=r"pip install 'idemkey-redis\[otel\]'"):
        otel_hook()
