"""A worker process for the crash tests: ``python -m tests.faults._http_worker URL PREFIX LEASE``.

Sends one keyed POST through the WSGI adapter (in process, werkzeug's test client) to an app
whose handler announces itself (``RPUSH {PREFIX}:started <fence>``) and then blocks until the
test pushes ``{PREFIX}:go``. Every idemkey event of this process is pushed to
``{PREFIX}:events`` as ``kind:fence``, and the HTTP answer is printed as one JSON line. The
test SIGKILLs or SIGSTOPs this process while its handler blocks.
"""

from __future__ import annotations

import json
import sys

import redis
from werkzeug.test import Client

from idemkey import Event, Policy, RedisStore
from idemkey.adapters.wsgi import IdempotencyMiddleware

GO_TIMEOUT = 60


def main(url: str, prefix: str, lease: float) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)

    def on_event(event: Event) -> None:
        client.rpush(f"{prefix}:events", f"{event.kind}:{event.fence}")

    store = RedisStore(client, Policy(prefix=prefix, lease=lease, on_event=on_event))

    def app(environ, start_response):  # type: ignore[no-untyped-def]
        fence = environ["idemkey.exchange"].claim.fence
        client.rpush(f"{prefix}:started", fence)
        if client.blpop([f"{prefix}:go"], timeout=GO_TIMEOUT) is None:
            sys.exit("never told to go on")
        start_response("201 Created", [("Content-Type", "application/json")])
        return [json.dumps({"ran_with_fence": fence}).encode()]

    web = Client(IdempotencyMiddleware(app, store))
    reply = web.post("/charges", data=b"{}", headers={"Idempotency-Key": "crash-key"})
    store.close()
    print(json.dumps({"status": reply.status_code, "body": reply.get_data(as_text=True)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
