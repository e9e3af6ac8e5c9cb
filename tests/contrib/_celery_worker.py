"""``celery -A tests.contrib._celery_worker worker ...``: the app, configured from the
environment the test started the worker with."""

from __future__ import annotations

import os

from tests.contrib._celery_app import make_app

app = make_app(
    os.environ["IDEMKEY_CELERY_URL"],
    os.environ["IDEMKEY_CELERY_PREFIX"],
    os.environ.get("IDEMKEY_CELERY_STORE_URL"),
    os.environ.get("IDEMKEY_CELERY_RESULT_SERIALIZER", "json"),
)
