"""Framework adapters: ``idemkey.adapters.wsgi``, ``idemkey.adapters.flask``,
``idemkey.adapters.asgi``, and the integrations built on them: ``idemkey.adapters.fastapi``,
``idemkey.adapters.starlette`` (both on the ASGI middleware) and ``idemkey.adapters.django``.

Import the one you use; this package imports no web framework, so the WSGI and ASGI
middlewares work without Flask installed.
"""

from __future__ import annotations
