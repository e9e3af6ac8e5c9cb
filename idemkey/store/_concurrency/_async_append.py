"""Appending one uncertain-outcome entry to its stream: the one retry loop of both keepers.

One text for both keepers, run in a task (asyncio) or in the store's writer thread: the async
file is the source, and scripts/unasync.py writes the sync one from it. A write that could not
connect (nothing reached Redis, so sending it again cannot make two entries) is tried again,
backing off, for up to :data:`~idemkey.store.uncertain.RETRY_SECONDS`; any other failure is
logged at debug level and the entry forgotten.
"""

# unasync: generates _sync_append.py
from __future__ import annotations

import time
from typing import Any, Final

from ...events import logger
from .._backend import _never_connected
from ..uncertain import MAX_ENTRIES, RETRY_SECONDS
from ._async_runtime import sleep

__all__ = ["append"]

#: The first wait before trying again, doubled after each try up to LONGEST_WAIT.
FIRST_WAIT: Final = 0.05
LONGEST_WAIT: Final = 1.0


async def append(client: Any, stream: str, fields: dict[str, str], ttl_ms: int) -> None:
    """Append ``fields`` to ``stream``, which then lives ``ttl_ms``; never raises."""
    deadline, delay = time.monotonic() + RETRY_SECONDS, FIRST_WAIT
    while True:
        try:
            pipe = client.pipeline(transaction=False)
            pipe.xadd(stream, fields, maxlen=MAX_ENTRIES, approximate=True)
            pipe.pexpire(stream, ttl_ms)
            await pipe.execute()
            return
        except Exception as exc:  # the request it describes went on, whatever happens here
            if not _never_connected(exc) or time.monotonic() + delay > deadline:
                logger.debug("idemkey could not keep an uncertain outcome: %s", exc)
                return
        await sleep(delay)
        delay = min(delay * 2, LONGEST_WAIT)
