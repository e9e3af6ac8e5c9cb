"""One attempt held to what is left of the deadline, as a task; twin of ``_sync_attempt``.

httpx's timeouts bound each network operation, not a response: a server that sends a byte
now and then never lets a read time out. So the whole attempt (pool, connect, send, the head
and every read of the body) runs under a cancel scope that ends with the deadline; the
cancellation closes the connection. Both modules export :func:`exchange`, :func:`overdue` and
:func:`drain`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import anyio
import httpx

__all__ = ["drain", "exchange", "overdue"]


def overdue(request: httpx.Request, seconds: float) -> httpx.TimeoutException:
    """What an attempt cut off by the deadline raises: an httpx timeout, as a transport would."""
    return httpx.TimeoutException(
        f"no complete answer within the {seconds:.3g} s left of the call's deadline",
        request=request,
    )


async def exchange(
    start: Callable[[httpx.Request], Awaitable[httpx.Response]],
    request: httpx.Request,
    seconds: float,
    configured: Mapping[str, float | None],
) -> httpx.Response:
    """``start(request)`` (a response not read yet), read and closed, within ``seconds``.

    ``configured``, the call's own timeouts, serves the sync twin (a thread it leaves behind on
    HTTP/2 keeps them); a cancelled task leaves nothing behind.
    """
    with anyio.move_on_after(seconds):
        response = await start(request)
        await drain(response)
        return response
    raise overdue(request, seconds)


async def drain(response: httpx.Response) -> None:
    """Read ``response`` to its end, and close it."""
    try:
        await response.aread()
    finally:
        await response.aclose()
