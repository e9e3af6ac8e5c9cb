"""A password in a Redis URL never comes back in an error about that URL.

A password holding '/', '?' or '#' unencoded (base64 secrets hold '/') ends the URL's host
early: ``redis://:Zm9v/YmFy@host:6379/0`` has the host ``:Zm9v``, so redis-py read a port
``Zm9v`` (and quoted it), or a database path holding the rest; with '#', redis-py took the URL
and connected to the wrong host without the password. Such a URL is refused, saying how to
encode, quoting none of it; and a port or database that is no number is not quoted when the
URL holds user information.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from urllib.parse import quote

import pytest
import redis

from idemkey.errors import ConfigurationError
from idemkey.store._url import client_from_url
from tests._servers import RedisServer
from tests.faults.test_url_clients import listener, nobody_connected  # noqa: F401 (fixture)

#: (URL, the pieces of its password, which no message may hold). ``{port}``: a listener.
UNENCODED = {
    "slash": ("redis://:Zm9v/YmFy+c2VjcmV0@127.0.0.1:{port}/0", ["Zm9v", "YmFy", "c2VjcmV0"]),
    "hash": ("redis://:Zm9v#YmFyc2VjcmV0@127.0.0.1:{port}/0", ["Zm9v", "YmFyc2VjcmV0"]),
    "question": ("redis://default:Zm9v?YmFyc2VjcmV0@127.0.0.1:{port}/0", ["Zm9v", "YmFyc2Vj"]),
    "digits-then-slash": ("redis://:12345/c2VjcmV0@127.0.0.1:{port}/0", ["12345", "c2VjcmV0"]),
    # redis-py took this one: the host '' and the port before the '#', no password.
    "port-then-hash": ("redis://:{port}#s3cret@127.0.0.1:{port}/0", ["s3cret"]),
    # An '@' in the password too: the host ends at its '/', after an '@' (password 'p').
    "at-then-slash": ("redis://u:p@x9/s3cret@127.0.0.1:{port}/0", ["x9", "s3cret"]),
}


def _said(error: BaseException) -> str:
    """What an error shows, itself and every error it was raised from (a traceback's text)."""
    parts = []
    seen: BaseException | None = error
    while seen is not None:
        parts.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


@pytest.mark.parametrize("kind", ["sync", "asyncio", "cluster"])
@pytest.mark.parametrize(("url", "secrets"), UNENCODED.values(), ids=UNENCODED.keys())
def test_a_password_with_an_unencoded_delimiter_is_refused_unquoted(
    listener: socket.socket,  # noqa: F811
    url: str,
    secrets: list[str],
    kind: str,
) -> None:
    port = listener.getsockname()[1]
    with pytest.raises(ConfigurationError) as caught:
        client_from_url(
            url.format(port=port),
            asyncio=kind == "asyncio",
            cluster=kind == "cluster",
            source="IDEMKEY_REDIS_URL",
        )
    said = _said(caught.value)
    assert str(caught.value).startswith("IDEMKEY_REDIS_URL cannot be used: ")
    assert "percent-encoded" in said
    assert "quote(" in said
    for secret in secrets:
        assert secret not in said
    assert "127.0.0.1" not in said  # nothing of the URL at all
    assert nobody_connected(listener)


def test_an_at_sign_after_the_host_is_refused_and_percent_40_is_read_as_one(
    listener: socket.socket,  # noqa: F811
) -> None:
    """An '@' in the query is taken for the end of an unencoded password too (the two cannot be
    told apart): written %40, it is the '@' it stands for."""
    port = listener.getsockname()[1]
    with pytest.raises(ConfigurationError, match="percent-encoded") as caught:
        client_from_url(f"redis://127.0.0.1:{port}/0?password=pa@ss")
    assert "pa@ss" not in _said(caught.value)
    assert "127.0.0.1" not in _said(caught.value)
    client = client_from_url(f"redis://127.0.0.1:{port}/0?password=pa%40ss")
    assert client.connection_pool.connection_kwargs["password"] == "pa@ss"
    encoded = client_from_url(f"redis://:Zm9v%2FYmFy%23c2Vj%3FcmV0@127.0.0.1:{port}/0")
    assert encoded.connection_pool.connection_kwargs["password"] == "Zm9v/YmFy#c2Vj?cmV0"
    assert nobody_connected(listener)


#: A URL with user information whose port or database is no number: not quoted. Without user
#: information the value is still quoted (a typo is easier to see): tests/faults.
NOT_A_NUMBER = {
    "port": ("redis://u:pw@127.0.0.1:s3cret/0", "Port could not be cast to integer value"),
    "port-range": ("redis://u:pw@127.0.0.1:99999/0", "Port out of range 0-65535"),
    "database": ("redis://u:pw@127.0.0.1:6379/s3cret", "the database in the URL's path"),
    "database-range": ("redis://:pw@127.0.0.1:6379/99999999999", "the database must be"),
}


@pytest.mark.parametrize(("url", "says"), NOT_A_NUMBER.values(), ids=NOT_A_NUMBER.keys())
def test_a_bad_port_or_database_is_not_quoted_beside_a_password(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        client_from_url(url)
    said = _said(caught.value)
    assert says in said
    assert "s3cret" not in said
    assert "99999" not in said
    assert "pw" not in said


def test_without_user_information_the_bad_value_is_still_quoted() -> None:
    with pytest.raises(ConfigurationError, match="'abc'"):
        client_from_url("redis://127.0.0.1:abc/0")
    with pytest.raises(ConfigurationError, match="'abc'"):
        client_from_url("redis://127.0.0.1:6379/abc")


def test_a_client_from_an_encoded_url_authenticates(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    """The encoding the refusal asks for works: quote(password, safe='') in the URL."""
    server = redis_server_factory()
    password = "Zm9v/YmFy+c2Vj#cmV0?x@y"
    with server.client() as admin:
        admin.config_set("requirepass", password)
    client = client_from_url(f"redis://:{quote(password, safe='')}@{server.host}:{server.port}/0")
    try:
        assert client.ping()
    finally:
        client.close()
    assert isinstance(client, redis.Redis)
