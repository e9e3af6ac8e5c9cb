"""The console: a read-only web page of the records and uncertain outcomes under a prefix.

``idemkey console --redis-url URL`` serves it on 127.0.0.1 (Starlette, Jinja2 and uvicorn:
``pip install 'idemkey-redis[console]'``). The page shows counts by state and by
route, the operations in flight and lapsed with their steps, the records released with steps,
and the latest uncertain outcomes; a few lines of inline JavaScript fetch the same view again
every few seconds (no build step, nothing loaded from elsewhere, nothing sent anywhere but this
server), one refresh at a time. Forgetting a record from the page needs ``--allow-forget`` and
a confirmation, and runs ``store.forget()`` with the state and fence the page showed. It
answers only requests whose ``Host`` names the address it serves (DNS rebinding), no read a
browser says comes from another site, and a forget only with the page's ``Origin`` and this
process's token (``_guard.py``). A default scope (a digest of credentials) is shown as a label
keyed by a secret of the process (``_view.ScopeLabels``), stored text as ``idemkey list``
prints it.

:func:`snapshot` is the view (one SCAN of the prefix), :func:`create_app` the Starlette app,
:func:`is_loopback` whether a ``--host`` keeps it on this machine.
"""

from __future__ import annotations

try:
    from ._app import create_app
except ImportError as exc:
    raise ImportError(
        "idemkey.console needs Starlette and Jinja2: pip install 'idemkey-redis[console]'"
    ) from exc
from ._guard import is_loopback
from ._view import Snapshot, snapshot

__all__ = ["Snapshot", "create_app", "is_loopback", "snapshot"]
