"""The statements on ``idemkey_effects``: fenced()'s upsert and its commit's write of the
result, the store's lookup of a key's committed row and its late record of a result into it.

``Effects`` (sync engine) and ``AsyncEffects`` (``AsyncEngine``) are what
``RedisStore(effects=...)`` and ``AsyncRedisStore(effects=...)`` take. The store asks
:meth:`Effects.find` on every claim that would run the work (Redis may have forgotten the key:
the database is the truth), and the guard, the step runner and the HTTP driver
:meth:`Effects.record` a result that was not known when its fenced transaction committed (a
value saved after the commit, a step's return value, the HTTP response) before they complete
in Redis. Both are one indexed statement on the primary key.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Final

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
    "default_table",
    "effects_table",
    "failed",
    "row_key",
    "upsert",
    "writer",
]

TABLE_NAME: Final = "idemkey_effects"
#: ``result`` of a row whose transaction committed with nothing saved (yet): the effect is
#: final; a result recorded after the commit replaces it. The store's ``COMMITTED_ONLY``.
COMMITTED: Final = b"\x00committed"
_STEP_SEPARATOR: Final = "#"
_TABLES: dict[int, Table] = {}


def effects_table(metadata: Any = None, name: str = TABLE_NAME) -> Table:
    """The ``idemkey_effects`` table on ``metadata`` (a private MetaData when None)."""
    from sqlalchemy import BigInteger, Column, DateTime, LargeBinary, MetaData, String, Table

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


def row_key(record: Record, step: str | None) -> str:
    return record.digest if step is None else f"{record.digest}{_STEP_SEPARATOR}{step}"


def _find(table: Table, record: Record, step: str | None) -> Any:
    """The committed, unexpired row of the record (or step): its result, or COMMITTED."""
    from sqlalchemy import select

    c = table.c
    return select(c.result).where(
        c.record == row_key(record, step), c.result.is_not(None), c.expires_at >= now()
    )


def _record(table: Table, record: Record, step: str | None, fence: int, result: bytes) -> Any:
    """Write ``result`` into the row ``fence``'s transaction committed; a row a newer claim
    fenced since (another fence) is left as it is."""
    from sqlalchemy import update

    c = table.c
    return (
        update(table)
        .where(c.record == row_key(record, step), c.fence == fence, c.result.is_not(None))
        .values(result=result)
    )


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
    there, in its greenlet).
    """

    def write(db: Any) -> bool:
        saved = _saved(call) if step is None else None
        if not db.execute(_save_statement(table, row, fence, saved or COMMITTED)).rowcount:
            return False
        if saved is None:  # the result is recorded after the commit (Effects.record)
            _unrecorded(call, step, fence)
        return True

    return write


def _unrecorded(call: Call[Any], step: str | None, fence: int) -> None:
    """The row of ``step`` (None: the call's) commits with no result: the guard, the step
    runner or the HTTP driver records it there before completing in Redis."""
    rows = call._unrecorded
    if rows is None:
        call._unrecorded = {step: fence}
    else:
        rows[step] = fence


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

    def find(self, record: Record, step: str | None = None) -> bytes | None:
        """The committed row's result for ``record`` (or its ``step``): the saved result,
        ``COMMITTED`` when none was recorded, or None when no fenced transaction committed."""
        try:
            with self.engine.connect() as conn:
                found = conn.execute(_find(self.table, record, step)).first()
        except Exception as exc:  # the database's own errors, whatever the driver
            raise failed("lookup", exc) from exc
        return None if found is None else bytes(found[0])

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
        return bool(written.rowcount)


class AsyncEffects:
    """:class:`Effects` for an ``AsyncEngine``, for ``AsyncRedisStore(effects=...)``."""

    def __init__(self, engine: AsyncEngine, *, table: Table | None = None) -> None:
        self.engine = engine
        self.table = table if table is not None else default_table()

    async def create(self) -> None:
        """Create the table when it does not exist (tests, small apps; else migrate)."""
        async with self.engine.begin() as conn:
            await conn.run_sync(lambda sync: self.table.create(sync, checkfirst=True))

    async def find(self, record: Record, step: str | None = None) -> bytes | None:
        """:meth:`Effects.find` on the asyncio engine."""
        try:
            async with self.engine.connect() as conn:
                found = (await conn.execute(_find(self.table, record, step))).first()
        except Exception as exc:
            raise failed("lookup", exc) from exc
        return None if found is None else bytes(found[0])

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
        return bool(written.rowcount)
