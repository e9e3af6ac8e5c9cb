"""The demo payments app, and the retry story ``idemkey demo`` plays against it.

* :mod:`.payments`: the payment rules and the demo's policy, free of any framework;
* :mod:`.flask_app`: the app in Flask (``idemkey demo``, ``idemkey serve``);
* :mod:`.asgi_app`: the same app behind the ASGI middleware, for uvicorn;
* :mod:`.server`: its store and a werkzeug server on a real port;
* :mod:`.http_client`: the story's HTTP client;
* :mod:`.story`: the story.

Nothing here imports the command line (it raises :class:`DemoError`, never the CLI's error),
and importing this package imports no web framework: Flask is imported when an app is made.
"""

from __future__ import annotations

from .errors import DemoError, ListenError, MissingPackageError
from .flask_app import create_app
from .payments import DEFAULT_ACCOUNT, Ledger, account_scope, demo_policy
from .server import open_store, running, serve
from .story import run_story

__all__ = [
    "DEFAULT_ACCOUNT",
    "DemoError",
    "Ledger",
    "ListenError",
    "MissingPackageError",
    "account_scope",
    "create_app",
    "demo_policy",
    "open_store",
    "run_story",
    "running",
    "serve",
]
