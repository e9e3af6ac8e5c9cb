"""Databases for the fenced-effects tests: SQLite in a temporary file, and a real PostgreSQL.

PostgreSQL comes from ``IDEMKEY_POSTGRES_URL`` (a server URL; default
``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``): the session creates its own database
there and drops it at the end. When no server answers, the PostgreSQL cases skip with the
reason, unless ``IDEMKEY_REQUIRE_POSTGRES=1`` (then they fail).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sa = pytest.importorskip("sqlalchemy", reason="the sql extra (SQLAlchemy) is not installed")

POSTGRES_URL_ENV = "IDEMKEY_POSTGRES_URL"
DEFAULT_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"

CHARGES_DDL = (
    "CREATE TABLE charges (key VARCHAR(200) NOT NULL, fence BIGINT, worker BIGINT)"
    # deliberately no unique constraint on key: only the fence keeps one row per key
)
#: The business table as the tests write it (CHARGES_DDL); its row count per key is the
#: count of committed runs.
CHARGES = sa.table("charges", sa.column("key"), sa.column("fence"), sa.column("worker"))


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a fresh database on the real PostgreSQL, dropped after the session."""
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    server = sa.make_url(os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES))
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    name = "idemkey_" + uuid.uuid4().hex[:12]
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        reason = f"no PostgreSQL at {server.render_as_string(hide_password=True)}: {exc.orig}"
        if os.environ.get("IDEMKEY_REQUIRE_POSTGRES") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database with ``idemkey_effects`` and an empty ``charges`` table (sync driver URL)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'effects.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    from idemkey.contrib.sqlalchemy import Effects

    engine = sa.create_engine(url)
    try:
        Effects(engine).create()
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE IF EXISTS charges"))
            conn.execute(sa.text("DELETE FROM idemkey_effects"))
            conn.execute(sa.text(CHARGES_DDL))
    finally:
        engine.dispose()
    return url


def async_url(url: str) -> str:
    """The asyncio driver's URL for the same database."""
    if url.startswith("sqlite"):
        return url.replace("sqlite://", "sqlite+aiosqlite://", 1)
    return url  # psycopg 3 speaks both


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    """A sync engine on ``db_url``, disposed after the test."""
    engine = sa.create_engine(db_url)
    yield engine
    engine.dispose()
