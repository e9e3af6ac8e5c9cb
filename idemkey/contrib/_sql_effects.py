"""The statements on ``idemkey_effects``: fenced()'s upsert and its commit's write of the
result, the store's lookup of a key's committed row and its late record of a result into it.

``Effects`` (sync engine) and ``AsyncEffects`` (``AsyncEngine``) are what
``RedisStore(effects=...)`` and ``AsyncRedisStore(effects=...)`` take. The store asks
:meth:`Effects.find` on every claim that would run the work (Redis may have forgotten the key:
the database is the truth), and the guard, the step runner and the HTTP driver
:meth:`Effects.record` a result that was not known when its fenced transaction committed (a
value saved after the commit, a step's return value, the HTTP response) before they complete
in Redis. Both are one indexed statement on the primary key.

A row's key names the record with its prefix (:func:`row_key`), and its ``result`` keeps the
fingerprint of the request that committed it before the value (:func:`row_value`): stores of
other prefixes sharing the table, and other requests with the key, never get its result. The
fingerprint is the claim's, carried by the ``Call`` fenced() is given, whatever thread or
context the transaction runs in. The schema is 0.3's; 0.3's rows (the bare digest, no
fingerprint) are still read, not compared.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final

from xxhash import xxh3_128_digest

from .._core._names import record_prefix
from ..errors import ConfigurationError, StoreError

if TYPE_CHECKING:
    from sqlalchemy import Engine, Table
    from sqlalchemy.ext.asyncio import AsyncEngine

    from .._core import Record
    from ..guard import Call

__all__ = [
    "COMMITTED",
    "AsyncEffects",
    "Effects",
    "Found",
    "default_table",
    "effects_table",
    "failed",
    "row_key",
    "row_value",
    "upsert",
    "writer",
]

TABLE_NAME: Final = "idemkey_effects"
#: ``result`` of a row whose transaction committed with nothing saved (yet): the effect is
#: final; a result recorded after the commit replaces it. The store's ``COMMITTED_ONLY``.
COMMITTED: Final = b"\x00committed"
_STEP_SEPARATOR: Final = "#"
#: Between the digest and the tag of a prefix that is not the default (neither hex nor ``#``).
_PREFIX_SEPARATOR: Final = "@"
#: ``Policy``'s default prefix: its rows keep 0.3's key, the bare digest.
_BARE_PREFIX: Final = "idemkey"
#: The prefix's tag: 16 hex digits of BLAKE2b, so the key fits VARCHAR(160) whatever the
#: prefix (32 + 1 + 16, then ``#`` and a step name of at most 100 characters: 150).
_TAG_BYTES: Final = 8
#: What starts a ``result`` that keeps the request's fingerprint, then its length (a byte; 0:
#: not known), the fingerprint, the value (an encoded result or :data:`COMMITTED`). 0.3 wrote
#: the value alone, which starts with a format byte (1, 2, 3) or is COMMITTED, never this.
_LAYOUT: Final = b"\x00row1"
_HEADER: Final = len(_LAYOUT) + 1
#: The longest request fingerprint a row keeps as it is (one length byte holds it).
_FINGERPRINT_MAX: Final = 64
#: The calls whose fenced rows committed, by record name and fence, for as long as they live:
#: a result recorded into such a row after its commit (:meth:`Effects.record`) keeps the
#: fingerprint of the call it belongs to. Filled by the commit's write, in whatever thread.
_COMMITTED: weakref.WeakValueDictionary[tuple[str, int], Call[Any]] = weakref.WeakValueDictionary()
_TABLES: dict[int, Table] = {}


def effects_table(metadata: Any = None, name: str = TABLE_NAME) -> Table:
    """The ``idemkey_effects`` table on ``metadata`` (a private MetaData when None)."""
    try:
        from sqlalchemy import BigInteger, Column, DateTime, LargeBinary, MetaData, String, Table
    except ImportError as exc:
        message = "effects_table() needs SQLAlchemy: pip install 'idemkey-redis[sql]'"
        raise ImportError(message) from exc

    metadata = metadata if metadata is not None else MetaData()
    return Table(
        name,
        metadata,
        Column("record", String(160), primary_key=True),
        Column("fence", BigInteger, nullable=False),
        Column("result", LargeBinary, nullable=True),
        Column("created_at", DateTime, nullable=False),
        Column("expires_at", DateTime, nullable=False),
    )


def default_table() -> Table:
    table = _TABLES.get(0)
    if table is None:
        table = _TABLES[0] = effects_table()
    return table


def now() -> datetime:
    # Naive UTC: the same value on every dialect (SQLite keeps no time zone).
    return datetime.now(timezone.utc).replace(tzinfo=None)


@lru_cache(maxsize=64)
def _tag(prefix: str) -> str:
    if prefix == _BARE_PREFIX:
        return ""
    tag = hashlib.blake2b(prefix.encode("utf-8", "surrogatepass"), digest_size=_TAG_BYTES)
    return _PREFIX_SEPARATOR + tag.hexdigest()


def row_key(record: Record, step: str | None, *, legacy: bool = False) -> str:
    """The key of the record's row (``step``: of that step's): the digest, with a tag of the
    record's prefix unless it is the default one, and ``#step``. ``legacy``: 0.3's key, the
    digest whatever the prefix."""
    digest = record.digest
    base = digest if legacy else digest + _tag(record_prefix(record.record_key))
    return base if step is None else f"{base}{_STEP_SEPARATOR}{step}"


def _kept(fingerprint: str | bytes) -> bytes:
    """What a row keeps of a claim's request fingerprint: the 16 bytes guards and the HTTP
    adapters send as they are; a longer one (a ``store.claim`` caller's own) as its digest."""
    if isinstance(fingerprint, str):
        fingerprint = fingerprint.encode("utf-8", "surrogatepass")
    return fingerprint if len(fingerprint) <= _FINGERPRINT_MAX else xxh3_128_digest(fingerprint)


def row_value(fingerprint: bytes | None, value: bytes) -> bytes:
    """A row's ``result``: what it keeps of the claim's request ``fingerprint`` (None: not
    known), then ``value``."""
    kept = b"" if fingerprint is None else _kept(fingerprint)
    return b"%b%c%b%b" % (_LAYOUT, len(kept), kept, value)


class Found(bytes):
    """:meth:`Effects.find`'s answer: the committed value (an encoded result, or
    :data:`COMMITTED`), with the ``fingerprint`` of the request that committed it (None: the
    row does not say, as 0.3's rows)."""

    fingerprint: bytes | None = None

    def reused(self, fingerprint: str | bytes) -> bool:
        """Whether the row was committed for another request than one with ``fingerprint``
        (False when the row does not say: it cannot be compared)."""
        return self.fingerprint is not None and self.fingerprint != _kept(fingerprint)


def _found(raw: bytes) -> Found:
    if raw[: len(_LAYOUT)] == _LAYOUT and len(raw) >= _HEADER:
        end = _HEADER + raw[len(_LAYOUT)]
        found = Found(raw[end:])
        found.fingerprint = raw[_HEADER:end] or None
        return found
    return Found(raw)


def _find(table: Table, record: Record, step: str | None) -> Any:
    """The committed, unexpired rows of the record (or step): under its key, and 0.3's."""
    from sqlalchemy import select

    c = table.c
    key, legacy = row_key(record, step), row_key(record, step, legacy=True)
    named = c.record == key if key == legacy else c.record.in_((key, legacy))
    return select(c.record, c.result).where(named, c.result.is_not(None), c.expires_at >= now())


def _pick(rows: Any, record: Record, step: str | None) -> Found | None:
    """The row under the record's key; else a row 0.3 wrote under the bare digest. A row of
    the new layout there is the default prefix's, not this record's."""
    key, legacy = row_key(record, step), None
    for name, raw in rows:
        raw = bytes(raw)
        if name == key:
            return _found(raw)
        if raw[: len(_LAYOUT)] != _LAYOUT:
            legacy = Found(raw)
    return legacy


def _record(table: Table, record: Record, step: str | None, fence: int, result: bytes) -> Any:
    """Write ``result`` into the row ``fence``'s transaction committed, with the fingerprint
    of the call that committed it (None: that call is not known here); a row a newer claim
    fenced since (another fence) is left as it is."""
    from sqlalchemy import update

    c = table.c
    call = _COMMITTED.get((record.record_key, fence))
    value = row_value(call._fingerprint if call is not None else None, result)
    return (
        update(table)
        .where(c.record == row_key(record, step), c.fence == fence, c.result.is_not(None))
        .values(result=value)
    )


def _recorded(record: Record, step: str | None, fence: int, result: bytes, rows: int) -> bool:
    """Whether ``result`` went into the committed row; the call that committed it learns it
    holds one now (a lost lease then says a retry replays it)."""
    call = _COMMITTED.get((record.record_key, fence)) if rows else None
    if call is not None:
        call._row_committed(step, fence, result)
    return bool(rows)


def upsert(dialect: str, table: Table, row: str, fence: int, ttl_ms: int) -> Any:
    """INSERT ... ON CONFLICT DO UPDATE ... WHERE, RETURNING the row when it is ours.

    The update applies only while the stored row belongs to no newer claim and holds no
    committed result; an expired row (past the retention) never counts.
    """
    from sqlalchemy.dialects import postgresql, sqlite

    inserts: dict[str, Callable[[Table], Any]] = {
        "postgresql": postgresql.insert,
        "sqlite": sqlite.insert,
    }
    insert = inserts.get(dialect)
    if insert is None:
        raise ConfigurationError(f"fenced() supports PostgreSQL and SQLite, not {dialect}")
    created = now()
    stmt = insert(table).values(
        record=row,
        fence=fence,
        result=None,
        created_at=created,
        expires_at=created + timedelta(milliseconds=ttl_ms),
    )
    current = table.c
    # A committed result is final; a newer fence has taken over. One fenced transaction per
    # call (or per step), then.
    ours = (current.fence <= stmt.excluded.fence) & current.result.is_(None)
    return stmt.on_conflict_do_update(
        index_elements=[current.record],
        set_={
            "fence": stmt.excluded.fence,
            "expires_at": stmt.excluded.expires_at,
            # A fresh period after expiry starts without the old result.
            "result": _case_result(current, created),
        },
        where=ours | (current.expires_at < created),
    ).returning(current.fence)


def _case_result(current: Any, now: datetime) -> Any:
    from sqlalchemy import case, null

    return case((current.expires_at < now, null()), else_=current.result)


def _save_statement(table: Table, row: str, fence: int, result: bytes) -> Any:
    from sqlalchemy import update

    c = table.c
    return update(table).where(c.record == row, c.fence == fence).values(result=result)


def writer(
    call: Call[Any], step: str | None, table: Table, row: str, fence: int
) -> Callable[[Any], bool]:
    """The commit's write of the saved result (read then) into the row; False when the
    database has no such row (a savepoint rolled the upsert back): the effect is not there.

    With nothing saved (a step, an HTTP handler, a block that saves after its commit) the row
    is marked committed all the same: no other claim may commit an effect after it, and a
    lookup finds no result to replay.

    At commit, not at ``save()``: the result may be saved before or after ``fenced()``, and an
    asyncio session can only run SQL from inside its own commit (SQLAlchemy runs the event
    there, in its greenlet). The row keeps the fingerprint of the request the call claimed
    for, which the call carries: no context is needed (a thread may commit it).
    """
    assert call.record is not None  # a claimed call (fenced() checked)
    name, fingerprint = call.record.record_key, call._fingerprint

    def write(db: Any) -> bool:
        saved = _saved(call) if step is None else None
        value = row_value(fingerprint, saved or COMMITTED)
        if not db.execute(_save_statement(table, row, fence, value)).rowcount:
            return False
        # A result known after the commit (none was saved, or another is saved over it) is
        # recorded into the row before Redis completes (Effects.record), with the fingerprint.
        call._row_committed(step, fence, saved)
        _COMMITTED[(name, fence)] = call
        return True

    return write


def _saved(call: Call[Any]) -> bytes | None:
    saved = getattr(call, "_saved", None)
    return saved if isinstance(saved, bytes) else None


def failed(what: str, exc: Exception) -> StoreError:
    """The database's error as a StoreError whose text never holds the statement's parameters
    (SQLAlchemy's text appends them: a stored result, a response, which the message carries
    on to logs, events and uncertain entries): the driver's own error, its first line."""
    cause = getattr(exc, "orig", None) or exc
    first = str(cause).partition("\n")[0]
    return StoreError(f"effects {what} failed: {type(cause).__name__}: {first}")


class Effects:
    """The store's view of ``idemkey_effects`` (sync engine): committed results by record."""

    def __init__(self, engine: Engine, *, table: Table | None = None) -> None:
        self.engine = engine
        self.table = table if table is not None else default_table()

    def create(self) -> None:
        """Create the table when it does not exist (tests, small apps; else migrate)."""
        self.table.create(self.engine, checkfirst=True)

    def find(self, record: Record, step: str | None = None) -> Found | None:
        """The committed row's result for ``record`` (or its ``step``): the saved result,
        ``COMMITTED`` when none was recorded, or None when no fenced transaction committed.
        Its ``fingerprint`` is the committing request's (None: a row that does not say)."""
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(_find(self.table, record, step)).all()
        except Exception as exc:  # the database's own errors, whatever the driver
            raise failed("lookup", exc) from exc
        return _pick(rows, record, step)

    def lookup(self, record: Record) -> bytes | None:
        """The result a committed fenced transaction saved for ``record``, if any."""
        found = self.find(record)
        return None if found == COMMITTED else found

    def record(self, record: Record, step: str | None, fence: int, result: bytes) -> bool:
        """Write ``result`` into the row the transaction of ``fence`` committed; False: none."""
        try:
            with self.engine.begin() as conn:
                written = conn.execute(_record(self.table, record, step, fence, result))
        except Exception as exc:
            raise failed("write", exc) from exc
        return _recorded(record, step, fence, result, written.rowcount)


class AsyncEffects:
    """:class:`Effects` for an ``AsyncEngine``, for ``AsyncRedisStore(effects=...)``."""

    def __init__(self, engine: AsyncEngine, *, table: Table | None = None) -> None:
        self.engine = engine
        self.table = table if table is not None else default_table()

    async def create(self) -> None:
        """Create the table when it does not exist (tests, small apps; else migrate)."""
        async with self.engine.begin() as conn:
            await conn.run_sync(lambda sync: self.table.create(sync, checkfirst=True))

    async def find(self, record: Record, step: str | None = None) -> Found | None:
        """:meth:`Effects.find` on the asyncio engine."""
        try:
            async with self.engine.connect() as conn:
                rows = (await conn.execute(_find(self.table, record, step))).all()
        except Exception as exc:
            raise failed("lookup", exc) from exc
        return _pick(rows, record, step)

    async def lookup(self, record: Record) -> bytes | None:
        """:meth:`Effects.lookup` on the asyncio engine."""
        found = await self.find(record)
        return None if found == COMMITTED else found

    async def record(self, record: Record, step: str | None, fence: int, result: bytes) -> bool:
        """:meth:`Effects.record` on the asyncio engine."""
        try:
            async with self.engine.begin() as conn:
                written = await conn.execute(_record(self.table, record, step, fence, result))
        except Exception as exc:
            raise failed("write", exc) from exc
        return _recorded(record, step, fence, result, written.rowcount)
