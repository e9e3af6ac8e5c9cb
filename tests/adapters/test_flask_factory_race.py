"""An app's first request checks the decorators' order over every app one Idemkey serves while
another thread's app factory runs ``init_app`` and ``add_url_rule``: the check reads snapshots,
so it never fails with "changed size during iteration" (a 500). The other thread's additions are
forced to land mid-check: a view's ``__wrapped__`` and an app's ``view_functions`` add them."""

from __future__ import annotations

import weakref
from typing import Any, ClassVar

import redis
from flask import Flask

from idemkey import RedisStore
from idemkey.adapters._flask_config import app_state, refuse_misordered


class _AddsRoutes:
    """A view that, each time the check reads its ``__wrapped__``, adds a route to ``app``."""

    def __init__(self, app: Flask) -> None:
        self.app, self.added = app, 0

    def __call__(self) -> str:
        return "x"

    @property
    def __wrapped__(self) -> None:
        self.added += 1
        self.app.add_url_rule(f"/late{self.added}", f"late{self.added}", lambda: "late")
        return None


def test_routes_added_during_the_check() -> None:
    app = Flask("tenant")
    app.add_url_rule("/r", "r", lambda: "r")
    hook = _AddsRoutes(app)
    app.add_url_rule("/hook", "hook", hook)
    refuse_misordered(app.view_functions, [], [app.view_functions])
    assert hook.added  # the routes did land mid-check


class _Tenant(Flask):
    """An app whose ``view_functions``, read by the check, comes with another app's init_app."""

    factory: list[Flask]
    apps: weakref.WeakSet[Flask]
    armed = False

    @property  # type: ignore[override]
    def view_functions(self) -> dict[str, Any]:
        if self.armed and len(self.factory) < 3:
            new = Flask(f"tenant{len(self.factory)}")
            self.factory.append(new)
            self.apps.add(new)
        return self._views

    @view_functions.setter
    def view_functions(self, value: dict[str, Any]) -> None:
        self._views = value


def test_apps_added_during_the_check() -> None:
    apps: weakref.WeakSet[Flask] = weakref.WeakSet()
    factory: list[Flask] = []
    _Tenant.factory, _Tenant.apps = factory, apps
    first, second = _Tenant("first"), _Tenant("second")
    apps.add(first)
    apps.add(second)
    state = app_state({}, RedisStore(redis.Redis(port=1)), None)
    state.endpoints, state.apps = first.view_functions, apps
    _Tenant.armed = True
    try:
        state.capture_rule([], [])
    finally:
        _Tenant.armed = False
    assert factory  # the apps did land mid-check


class _ChangesOnce(weakref.WeakSet[Flask]):
    """A WeakSet another thread's init_app adds to while the first read of it runs."""

    reads = 0
    late: ClassVar[list[Flask]] = []

    def __iter__(self) -> Any:
        self.reads += 1
        for n, app in enumerate(super().__iter__()):
            if self.reads == 1 and n == 0:
                self.late.append(Flask("late"))
                self.add(self.late[-1])
            yield app


def test_apps_snapshot_is_read_again_when_an_app_lands_mid_read() -> None:
    first = Flask("first")
    apps = _ChangesOnce()
    apps.add(first)
    state = app_state({}, RedisStore(redis.Redis(port=1)), None)
    state.endpoints, state.apps = first.view_functions, apps
    state.capture_rule([], [])
    assert apps.reads == 2
