"""Settings of the Django project the framework tests run (test Client, gunicorn, uvicorn).

The servers read the Redis URL and key prefix from the environment; in-process tests apply the
same values with ``override_settings`` (see ``tests/frameworks/test_django.py``).
"""

from __future__ import annotations

import os

SECRET_KEY = "idemkey-tests"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.frameworks.djangoproject.urls"
INSTALLED_APPS: list[str] = []
USE_TZ = True
#: idemkey's first, as docs/django.md inserts it (the token middleware's request.user is
#: set before idemkey decides all the same: it decides in process_view).
MIDDLEWARE = [
    "idemkey.adapters.django.IdempotencyMiddleware",
    "tests.frameworks.djangoproject.views.TokenUserMiddleware",
]
#: A new project's CSRF protection, below idemkey's (inserted first, as docs/django.md has it):
#: the servers run it when IDEMKEY_TEST_CSRF is set.
CSRF_MIDDLEWARE = [*MIDDLEWARE, "django.middleware.csrf.CsrfViewMiddleware"]
if os.environ.get("IDEMKEY_TEST_CSRF"):
    MIDDLEWARE = CSRF_MIDDLEWARE
REDIS_URL = os.environ.get("IDEMKEY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
IDEMKEY = {
    "REDIS_URL": REDIS_URL,
    "PREFIX": os.environ.get("IDEMKEY_TEST_PREFIX", "idemkey"),
    "LEASE": 10.0,
}
