"""Fenced effects: the business write and the idempotency outcome in one SQL transaction.

Redis is the fast path and the database the truth; this closes the holes every Redis-only
design has, for effects that land in a SQL database (PostgreSQL or SQLite, through
SQLAlchemy 2):

* **A stale owner** (a worker frozen past its lease while a successor took over) cannot commit:
  :func:`fenced` upserts the record's row in ``idemkey_effects`` only while the stored fence is
  not newer than the call's, so the stale transaction fails with ``LeaseLostError`` and rolls
  back with the user's own writes.
* **A lost completion** (the transaction committed, then the worker died before Redis heard of
  it): ``call.save(value)`` inside the fenced transaction writes the encoded result into the row,
  in the same commit. A store built with ``effects=Effects(engine)`` reads that row on every
  claim that would run the work (one primary-key SELECT; a replay from Redis reads nothing),
  completes Redis with it and replays it; the work does not run again.
* **Redis forgetting** (a restart without persistence, a failover, an eviction): the same read
  tells a forgotten key from a new one, whatever the fence. A result known only after the
  commit (an HTTP response, a step's result, a value saved after it) is written into the
  committed row before Redis completes (``_sql_effects.Effects.record``); a row committed
  without one raises ``EffectCommittedError`` on every retry (HTTP: 409 ``response_lost``).

::

    store = RedisStore(redis_client, effects=Effects(engine))
    with guard(store, f"charge:{invoice.id}", payload=invoice.body) as call:
        if call.replayed:
            return call.result
        with Session(engine) as session, session.begin():
            session.add(Charge(invoice_id=invoice.id, amount=invoice.amount))
            fenced(session, call)  # just before the commit: it locks the row until then
            call.save({"invoice": invoice.id})  # completes the record only if this commits

The migration, as plain SQL (PostgreSQL; SQLite takes the same with ``BLOB`` for ``BYTEA``)::

    CREATE TABLE idemkey_effects (
        record     VARCHAR(160) PRIMARY KEY,  -- record digest, or digest + "#" + step name
        fence      BIGINT       NOT NULL,     -- fence of the claim that wrote it last
        result     BYTEA,                     -- the saved result (idemkey's encoding), or NULL
        created_at TIMESTAMP    NOT NULL,
        expires_at TIMESTAMP    NOT NULL      -- after it the row no longer counts (retention)
    );

or ``effects_table(metadata)`` for Alembic / ``metadata.create_all``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from ..errors import ConfigurationError, LeaseLostError
from ._sql_effects import (
    COMMITTED,
    TABLE_NAME,  # noqa: F401  (re-exported, as before)
    AsyncEffects,
    Effects,
    default_table,
    effects_table,
    now,
    row_key,
)

if TYPE_CHECKING:
    from sqlalchemy import Table
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

    from .._core import Record
    from ..guard import Call
    from ..guard._call import Tie

__all__ = [
    "AsyncEffects",
    "Effects",
    "afenced",
    "effects_table",
    "fenced",
]


def _call_parts(call: Call[Any]) -> tuple[Record, int]:
    record, fence = getattr(call, "record", None), call.fence
    if call.replayed or record is None or fence is None:
        raise ConfigurationError("fenced() needs a claimed call (not a replay) from guard/aguard")
    return record, fence


def _upsert(dialect: str, table: Table, row: str, fence: int, ttl_ms: int) -> Any:
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


def _lost(fence: int) -> LeaseLostError:
    return LeaseLostError(fence)


def _ttl_ms(call: Call[Any], ttl_ms: int | None) -> int:
    return ttl_ms if ttl_ms is not None else int(getattr(call, "ttl_ms", 86_400_000))


def fenced(
    db: Session | Any,
    call: Call[Any],
    *,
    step: str | None = None,
    ttl_ms: int | None = None,
    table: Table | None = None,
) -> None:
    """Fence the caller's open transaction on ``call``'s record (sync ``Session``/``Connection``).

    Raises ``LeaseLostError`` when a newer claim fenced the record, or another claim already
    committed its result: roll the transaction back (a ``with session.begin()`` block does). The
    result passed to ``call.save()`` before the commit is written into the row by the commit.
    ``step`` fences one recovery point instead of the whole call.

    From here on ``call``'s saved result belongs to this transaction: if it rolls back (this
    refusal, a failed flush or COMMIT, any exception), a value saved before the rollback is
    dropped and the guard releases the key instead of completing it with a result that never
    happened; the guard completes with it only once the transaction committed.
    """
    record, fence = _call_parts(call)
    fence_ = _tie(db, call)  # first: a failing flush inside the upsert rolls back tied
    table = table if table is not None else default_table()
    row = row_key(record, step)
    stmt = _upsert(_dialect(db), table, row, fence, _ttl_ms(call, ttl_ms))
    if db.execute(stmt).first() is None:
        fence_.refused()
        raise _lost(fence)
    fence_.write = _writer(call, step, table, row, fence)


async def afenced(
    db: AsyncSession | AsyncConnection,
    call: Call[Any],
    *,
    step: str | None = None,
    ttl_ms: int | None = None,
    table: Table | None = None,
) -> None:
    """:func:`fenced` for an ``AsyncSession`` or ``AsyncConnection``."""
    record, fence = _call_parts(call)
    sync = db.sync_session if hasattr(db, "sync_session") else db.sync_connection
    fence_ = _tie(sync, call)
    table = table if table is not None else default_table()
    row = row_key(record, step)
    stmt = _upsert(_dialect(db), table, row, fence, _ttl_ms(call, ttl_ms))
    if (await db.execute(stmt)).first() is None:
        fence_.refused()
        raise _lost(fence)
    fence_.write = _writer(call, step, table, row, fence)


def _dialect(db: Any) -> str:
    """The dialect's name, for a (sync or async) Session or Connection."""
    bind = db.get_bind() if hasattr(db, "get_bind") else db.engine
    return str(bind.dialect.name)


def _writer(call: Call[Any], step: str | None, table: Table, row: str, fence: int) -> Any:
    """The statement the commit runs to write the saved result (read then) into the row.

    With nothing saved (a step, an HTTP handler, a block that saves after its commit) the row
    is marked committed all the same: no other claim may commit an effect after it, and a
    lookup finds no result to replay.

    At commit, not at ``save()``: the result may be saved before or after ``fenced()``, and an
    asyncio session can only run SQL from inside its own commit (SQLAlchemy runs the event
    there, in its greenlet).
    """

    def write() -> Any:
        saved = _saved(call) if step is None else None
        if saved is None:  # the result is recorded after the commit (Effects.record)
            _unrecorded(call, step, fence)
        return _save_statement(table, row, fence, saved or COMMITTED)

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


class _Fence:
    """One fenced() call on one transaction: its tie to the call, and the row write of its
    commit (None until the upsert made the row the call's; a refused one writes nothing)."""

    __slots__ = ("tie", "write")

    def __init__(self, tie: Tie) -> None:
        self.tie = tie
        self.write: Callable[[], Any] | None = None

    def refused(self) -> None:
        self.tie.call._refused()


class _Fences:
    """The fences of one Session's or Connection's current transaction."""

    __slots__ = ("committing", "open")

    def __init__(self) -> None:
        self.open: list[_Fence] = []
        self.committing: list[_Fence] = []

    def commit_rows(self, db: Any) -> None:
        for fence in self.open:
            if fence.write is not None:
                db.execute(fence.write())

    def end(self, committed: bool) -> None:
        fences, self.open = self.open, []
        for fence in fences:
            (fence.tie.committed if committed else fence.tie.rolled_back)()


_INFO_KEY: Final = "idemkey.fences"
_CONNECTIONS: weakref.WeakKeyDictionary[Any, _Fences] = weakref.WeakKeyDictionary()
_ENGINES: weakref.WeakSet[Any] = weakref.WeakSet()


def _tie(db: Any, call: Call[Any]) -> _Fence:
    """Tie ``call``'s saved result to ``db``'s transaction (listeners set once per object).

    A Session reports its outcome exactly: ``after_commit`` of the root transaction, then
    ``after_transaction_end`` (a rollback, a failed flush or COMMIT, a close). A Connection has
    no after-commit event: its ``commit`` event comes before the COMMIT is sent, and the
    engine's ``handle_error`` reports a COMMIT that failed.
    """
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    if isinstance(db, Session):
        fence = _Fence(call._tie())
        fences = db.info.get(_INFO_KEY)
        if fences is None:
            fences = db.info[_INFO_KEY] = _Fences()
            event.listen(db, "before_commit", _session_before_commit)
            event.listen(db, "after_commit", _session_after_commit)
            event.listen(db, "after_transaction_end", _session_after_end)
        fences.open.append(fence)
        return fence
    if db is None or not hasattr(db, "in_transaction") or not hasattr(db, "engine"):
        raise ConfigurationError("fenced() needs a SQLAlchemy Session or Connection")
    fence = _Fence(call._tie())
    fences = _CONNECTIONS.get(db)
    if fences is None:
        fences = _CONNECTIONS[db] = _Fences()
        event.listen(db, "begin", _connection_begin)
        event.listen(db, "commit", _connection_commit)
        event.listen(db, "rollback", _connection_rollback)
        engine = db.engine
        if engine not in _ENGINES:
            _ENGINES.add(engine)
            event.listen(engine, "handle_error", _connection_error)
    fences.open.append(fence)
    return fence


def _session_before_commit(session: Session) -> None:
    if not session.in_nested_transaction():  # a savepoint's commit is not the commit
        session.info[_INFO_KEY].commit_rows(session)


def _session_after_commit(session: Session) -> None:
    if not session.in_nested_transaction():
        session.info[_INFO_KEY].end(committed=True)


def _session_after_end(session: Session, transaction: Any) -> None:
    if transaction.parent is None:  # the root: whatever is still open did not commit
        session.info[_INFO_KEY].end(committed=False)


def _connection_begin(conn: Any) -> None:
    _CONNECTIONS[conn].committing = []  # a new transaction: the last COMMIT has returned


def _connection_commit(conn: Any) -> None:
    fences = _CONNECTIONS[conn]
    fences.commit_rows(conn)
    fences.committing, fences.open = fences.open, []
    for fence in fences.committing:
        fence.tie.committing()


def _connection_rollback(conn: Any) -> None:
    _CONNECTIONS[conn].end(committed=False)


def _connection_error(context: Any) -> None:
    fences = _CONNECTIONS.get(context.connection) if context.connection is not None else None
    if fences is not None and context.statement is None:  # the COMMIT failed, not a statement
        committing, fences.committing = fences.committing, []
        for fence in committing:
            fence.tie.rolled_back()
