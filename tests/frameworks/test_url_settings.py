"""Flask's ``IDEMKEY_REDIS_URL`` and Django's ``IDEMKEY`` never quote a password back.

A password with an unencoded '#' or '/' ends the URL's host early: redis-py read its start as
the port, and the ConfigurationError said ``Port could not be cast to integer value as
's3cret'``; a URL put in ``IDEMKEY["CLIENT"]`` was quoted whole, twice (as the value, and in
Django's ImportError). Each is still a ConfigurationError at start-up, saying what to do.
"""

from __future__ import annotations

import pytest
from flask import Flask

from idemkey import ConfigurationError
from idemkey.adapters.flask import Idemkey

#: Passwords written into the URL without percent-encoding their '#', '/' or '?'.
UNENCODED = [
    "redis://:s3cret#pw@127.0.0.1:1/0",
    "redis://:s3cret/pw@127.0.0.1:1/0",
    "redis://default:s3cret?pw@127.0.0.1:1/0",
]


def _said(error: BaseException) -> str:
    """What a traceback of ``error`` shows: it and every error it was raised from."""
    parts = []
    seen: BaseException | None = error
    while seen is not None:
        parts.append(str(seen))
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    return "\n".join(parts)


@pytest.mark.parametrize("url", UNENCODED)
def test_flask_refuses_an_unencoded_password_without_quoting_it(url: str) -> None:
    app = Flask(__name__)
    app.config["IDEMKEY_REDIS_URL"] = url
    with pytest.raises(ConfigurationError, match="IDEMKEY_REDIS_URL cannot be used") as caught:
        Idemkey(app)
    assert "percent-encoded" in str(caught.value)
    assert "s3cret" not in _said(caught.value)


def _django_middleware(settings: object) -> None:
    from django.test.utils import override_settings

    from idemkey.adapters.django import IdempotencyMiddleware
    from tests.adapters.harness_wsgi import _django

    _django()
    with override_settings(IDEMKEY=settings):
        IdempotencyMiddleware(lambda request: None)


@pytest.mark.parametrize("url", UNENCODED)
def test_django_refuses_an_unencoded_password_without_quoting_it(url: str) -> None:
    with pytest.raises(ConfigurationError, match=r'IDEMKEY\["REDIS_URL"\] cannot be') as caught:
        _django_middleware({"REDIS_URL": url})
    assert "percent-encoded" in str(caught.value)
    assert "s3cret" not in _said(caught.value)


@pytest.mark.parametrize(
    "url", ["redis://:s3cret@127.0.0.1:6379/0", "rediss://user:s3cret@cache.internal:6380"]
)
def test_django_says_a_url_in_client_goes_in_redis_url_without_quoting_it(url: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _django_middleware({"CLIENT": url})
    message = str(caught.value)
    assert message.startswith('IDEMKEY["CLIENT"]: ')
    assert 'a URL goes in IDEMKEY["REDIS_URL"]' in message
    assert "s3cret" not in _said(caught.value)
    assert "127.0.0.1" not in message
    assert "cache.internal" not in message


def test_django_still_quotes_a_dotted_path_it_cannot_import() -> None:
    with pytest.raises(ConfigurationError, match=r"cannot import 'nowhere\.client'"):
        _django_middleware({"CLIENT": "nowhere.client"})
