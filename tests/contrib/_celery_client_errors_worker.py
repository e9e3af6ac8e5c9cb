"""``celery -A tests.contrib._celery_client_errors_worker worker``: Celery's defaults (JSON
results in the Redis backend, the prefork pool) and one task that calls idemkey's client, for
tests/contrib/test_celery_client_errors.py (the broker URL and queue from the environment)."""

from __future__ import annotations

import os

from celery import Celery

from idemkey.client import Client, RetryPolicy

URL = os.environ["IDEMKEY_CELERY_URL"]
app = Celery("idemkey_client_errors", broker=URL, backend=URL, set_as_current=False)
app.conf.update(
    task_default_queue=os.environ["IDEMKEY_CELERY_PREFIX"],
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
)


@app.task(name="tests.client_post")
def client_post(base_url: str, path: str) -> int:
    """POSTs to ``path`` as a task would; the client's error, if any, is the task's."""
    retry = RetryPolicy(max_attempts=2, deadline=10.0, backoff=0.01, backoff_cap=0.01)
    with Client(base_url=base_url, retry=retry, on_replay="refuse", timeout=5.0) as client:
        return client.post(path, json={"amount": 1}).status_code
