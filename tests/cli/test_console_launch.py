"""A second ``idemkey console`` on a port the first one holds is refused, even while the first
is still starting (connecting to a slow Redis): the port is bound and listened on before
anything else, so the second gets one line and exit status 2, not a port shared by both.

Linux lets two sockets with ``SO_REUSEADDR`` bind one address as long as neither listens: the
first console's bound socket did not keep the second out until uvicorn listened on it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from idemkey.cli._base import CliError
from idemkey.cli.console import _bind
from tests._servers import HOST
from tests.cli.conftest import ROOT


def test_a_port_bound_by_a_console_is_refused_to_the_next() -> None:
    first = _bind(HOST, 0)  # the kernel's pick, bound at once: no other process can take it
    port = first.getsockname()[1]
    try:
        with pytest.raises(CliError) as refused:
            _bind(HOST, port)
    finally:
        first.close()
    assert refused.value.code == 2
    assert f"port {port} on {HOST} is in use" in str(refused.value)
    _bind(HOST, port).close()  # free again once the first is gone


@pytest.mark.redis
def test_a_second_console_is_refused_while_the_first_is_starting(redis_url: str) -> None:
    starting = _bind(HOST, 0)  # what the first console holds while Redis answers slowly
    port = starting.getsockname()[1]
    command = [sys.executable, "-m", "idemkey", "--redis-url", redis_url, "console"]
    try:
        result = subprocess.run(
            [*command, "--port", str(port)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=30,  # a second console that serves never exits
            stdin=subprocess.DEVNULL,
        )
    finally:
        starting.close()
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr == (
        f"idemkey console: port {port} on 127.0.0.1 is in use (another console?): choose "
        "another with --port\n"
    )
