"""Fenced effects: the business write and the idempotency outcome in one SQL transaction.

Redis is the fast path and the database the truth; this closes the holes every Redis-only
design has, for effects that land in a SQL database (PostgreSQL or SQLite, SQLAlchemy 2):

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

The table's migration (plain SQL) is in docs/effects.md; Alembic: ``effects_table(metadata)``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ..errors import ConfigurationError, LeaseLostError, UnprotectedCallError
from ._sql_effects import (
    TABLE_NAME,  # noqa: F401  (re-exported, as before)
    AsyncEffects,
    Effects,
    default_table,
    effects_table,
    failed,
    row_key,
    upsert,
    writer,
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
    if call.replayed:
        raise ConfigurationError("fenced() needs a claimed call (not a replay) from guard/aguard")
    if record is None or fence is None:
        # The one call that runs unclaimed: Redis failed under on_store_error="open". Without
        # a fence nothing tells a stale or second run from this one: its work must not commit.
        raise UnprotectedCallError()
    return record, fence


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

    From here on ``call``'s saved result belongs to this transaction (to the savepoint it runs
    in, then to the one that savepoint is released into): if that rolls back (this refusal, a
    failed flush or COMMIT, any exception), a value saved before the rollback is dropped and the
    guard releases the key instead of completing it with a result that never happened; the
    guard completes with it only once the transaction committed with the row in it.

    ``ConfigurationError``: ``db`` is no ``Session`` bound to an engine or connection, nor a
    ``Connection``, or ``call`` is a replay. ``StoreError``: the database refused the upsert
    (the effects table missing or of another schema, the database down), as ``Effects``
    reports the same table. ``UnprotectedCallError`` (a ``StoreError``): ``call`` runs
    unprotected (Redis failed under ``Policy(on_store_error="open")``): it has no fence, and
    its fenced work refuses to run.

    The row keeps the fingerprint of the request ``call`` was claimed for (the call carries
    it: the transaction may run in any thread or context): after Redis forgot the record,
    another request with the key is key reuse, not this one's replay.
    """
    from sqlalchemy.exc import DBAPIError

    record, fence = _call_parts(call)
    table = _table(call, table)
    row = row_key(record, step)
    stmt = _statement(db, db, call, table, row, fence, ttl_ms)
    fence_ = _tie(db, call)  # first: a failing flush rolls back tied
    if getattr(db, "autoflush", False):
        db.flush()  # what execute() flushes first: a failure there is the caller's own
    try:
        ours = db.execute(stmt).first()
    except DBAPIError as exc:
        raise _upsert_failed(fence_, exc) from exc
    _upserted(fence_, ours, call, step, table, row, fence)


async def afenced(
    db: AsyncSession | AsyncConnection,
    call: Call[Any],
    *,
    step: str | None = None,
    ttl_ms: int | None = None,
    table: Table | None = None,
) -> None:
    """:func:`fenced` for an ``AsyncSession`` or ``AsyncConnection``."""
    from sqlalchemy.exc import DBAPIError

    record, fence = _call_parts(call)
    sync = getattr(db, "sync_session", None)
    sync = sync if sync is not None else getattr(db, "sync_connection", None)
    table = _table(call, table)
    row = row_key(record, step)
    stmt = _statement(sync, db, call, table, row, fence, ttl_ms)
    if _joined(sync):  # begun here, so that _tie sends nothing
        await db.connection()  # type: ignore[union-attr,unused-ignore]
    fence_ = _tie(sync, call)
    if getattr(sync, "autoflush", False):
        await db.flush()  # type: ignore[union-attr]  # an AsyncSession's (as fenced())
    try:
        ours = (await db.execute(stmt)).first()
    except DBAPIError as exc:
        raise _upsert_failed(fence_, exc) from exc
    _upserted(fence_, ours, call, step, table, row, fence)


def _table(call: Call[Any], table: Table | None) -> Table:
    """``table``, else the table of the ``Effects`` of the store ``call`` was claimed in (the
    one its lookups read after Redis forgot), else ``idemkey_effects``."""
    if table is not None:
        return table
    effects = call._effects()
    found = getattr(effects, "table", None)
    return found if found is not None else default_table()


def _statement(
    db: Any, given: Any, call: Call[Any], table: Table, row: str, fence: int, ttl: int | None
) -> Any:
    """The upsert for ``db`` (a sync Session or Connection; for afenced, the sync twin of the
    async one ``given``), checked before anything is tied or sent: a misuse saves nothing (the
    key is released)."""
    try:
        return upsert(_dialect(db, given), table, row, fence, _ttl_ms(call, ttl))
    except ConfigurationError:
        call._refused()  # a value saved for this transaction is void
        raise


def _dialect(db: Any, given: Any) -> str:
    from sqlalchemy.engine import Connection
    from sqlalchemy.exc import UnboundExecutionError
    from sqlalchemy.orm import Session

    name = "fenced" if db is given else "afenced"
    if isinstance(db, Session):
        try:
            return str(db.get_bind().dialect.name)
        except UnboundExecutionError as exc:  # Session() with no bind, or binds= only
            raise ConfigurationError(
                f"{name}() needs a Session bound to an engine or a connection: {exc}"
            ) from exc
    if isinstance(db, Connection):
        return str(db.engine.dialect.name)
    raise ConfigurationError(
        "fenced() takes a SQLAlchemy Session or Connection, afenced() an AsyncSession or "
        f"AsyncConnection; {name}() was given {type(given).__name__}"
    )


def _upsert_failed(fence_: _Fence, exc: Exception) -> Exception:
    """The database refused the upsert: nothing is the call's; ``StoreError`` as Effects says
    of the same table (a missing or other table, the database down: its errors tell no more)."""
    fence_.refused()
    return failed("upsert", exc)


def _upserted(
    fence_: _Fence, ours: Any, call: Call[Any], step: str | None, table: Table, row: str, fence: int
) -> None:
    if ours is None:
        fence_.refused()
        raise LeaseLostError(fence)
    fence_.write = writer(call, step, table, row, fence)


class _Fence:
    """One fenced() call on one transaction: its tie to the call, the savepoints its row was
    written under (innermost first: a Session's nested transactions, a Connection's savepoint
    names), and its commit's row write (None until the upsert made the row the call's; a refused
    one writes nothing) with whether that write found the row."""

    __slots__ = ("savepoints", "tie", "write", "written")

    def __init__(self, tie: Tie, savepoints: tuple[Any, ...]) -> None:
        self.tie = tie
        self.savepoints = savepoints
        self.write: Callable[[Any], bool] | None = None
        self.written = False

    def refused(self) -> None:
        self.tie.call._refused()


class _Fences:
    """The fences of one Session's or Connection's current transaction."""

    __slots__ = ("committing", "open", "released")

    def __init__(self) -> None:
        self.open: list[_Fence] = []
        self.committing: list[_Fence] = []
        self.released: Any = None  # a Session's savepoint whose RELEASE returned

    def commit_rows(self, db: Any) -> None:
        for fence in self.open:
            fence.written = fence.write is not None and fence.write(db)

    def end(self, committed: bool, savepoint: Any = None) -> list[_Fence]:
        """End the open fences (``savepoint``: those written under it, which rolled back).
        Those the commit wrote no row for did not commit: they end rolled back, first (a value
        they drop is not kept by a tie ending committed); the others are returned."""
        if savepoint is None:
            ended, self.open = self.open, []
        else:
            ended = [fence for fence in self.open if savepoint in fence.savepoints]
            self.open = [fence for fence in self.open if savepoint not in fence.savepoints]
        kept = [fence for fence in ended if committed and fence.written]
        for fence in ended:
            if fence not in kept:
                fence.tie.rolled_back()
        return kept


_INFO_KEY: Final = "idemkey.fences"
_CONNECTIONS: weakref.WeakKeyDictionary[Any, _Fences] = weakref.WeakKeyDictionary()
_ENGINES: weakref.WeakSet[Any] = weakref.WeakSet()


def _tie(db: Any, call: Call[Any]) -> _Fence:
    """Tie ``call``'s saved result to ``db``'s transaction (listeners set once per object).

    A Session reports its outcome exactly: ``after_commit`` of the root transaction, then
    ``after_transaction_end`` (a rollback, a failed flush or COMMIT, a close); a savepoint's
    ``after_commit`` is its RELEASE, and its ``after_transaction_end`` without one a rollback.
    A Connection has no after-commit event: its ``commit`` event comes before the COMMIT is
    sent, and the engine's ``handle_error`` reports a COMMIT that failed; ``rollback_savepoint``
    names the savepoint rolled back.
    """
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    if _joined(db):
        # Its COMMIT, if any, is the Connection's, whoever sends it: session.commit() of a
        # Session joined to an outer transaction sends none (or releases a savepoint).
        db = db.connection()
    elif isinstance(db, Session):
        fence = _Fence(call._tie(), _session_savepoints(db))
        fences = db.info.get(_INFO_KEY)
        if fences is None:
            fences = db.info[_INFO_KEY] = _Fences()
            event.listen(db, "before_commit", _session_before_commit)
            event.listen(db, "after_commit", _session_after_commit)
            event.listen(db, "after_transaction_end", _session_after_end)
        fences.open.append(fence)
        return fence
    fence = _Fence(call._tie(), _connection_savepoints(db))
    fences = _CONNECTIONS.get(db)
    if fences is None:
        fences = _CONNECTIONS[db] = _Fences()
        event.listen(db, "begin", _connection_begin)
        event.listen(db, "commit", _connection_commit)
        event.listen(db, "rollback", _connection_rollback)
        event.listen(db, "rollback_savepoint", _connection_rollback_savepoint)
        engine = db.engine
        if engine not in _ENGINES:
            _ENGINES.add(engine)
            event.listen(engine, "handle_error", _connection_error)
    fences.open.append(fence)
    return fence


def _joined(db: Any) -> bool:
    """Whether ``db`` is a Session bound to a Connection (SQLAlchemy's "join a Session into an
    external transaction" recipe): its commit() may send no COMMIT, so its fences are tied to
    that Connection's own commit and rollback, as a Connection's are."""
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    return isinstance(db, Session) and isinstance(db.get_bind(), Connection)


def _session_savepoints(session: Session) -> tuple[Any, ...]:
    found, transaction = [], session.get_nested_transaction()
    while transaction is not None:
        if transaction.nested:  # not a subtransaction (a flush's)
            found.append(transaction)
        transaction = transaction.parent
    return tuple(found)


def _connection_savepoints(conn: Any) -> tuple[Any, ...]:
    # The names rollback_savepoint gives: SQLAlchemy keeps them in NestedTransaction._savepoint
    # and chains the open ones by _previous_nested (since 1.4; there is no public accessor).
    # Should they go, the fence counts as the transaction's, and the commit's UPDATE finding no
    # row still tells that a savepoint rolled the effect back.
    found, nested = [], conn.get_nested_transaction()
    while nested is not None:
        found.append(getattr(nested, "_savepoint", None))
        nested = getattr(nested, "_previous_nested", None)
    return tuple(found)


def _session_before_commit(session: Session) -> None:
    if not session.in_nested_transaction():  # a savepoint's commit is not the commit
        session.info[_INFO_KEY].commit_rows(session)


def _session_after_commit(session: Session) -> None:
    fences = session.info[_INFO_KEY]
    if session.in_nested_transaction():  # RELEASE returned: its fences go on with its parent
        fences.released = session.get_nested_transaction()
        return
    for fence in fences.end(committed=True):
        fence.tie.committed()


def _session_after_end(session: Session, transaction: Any) -> None:
    fences = session.info[_INFO_KEY]
    if transaction.parent is None:  # the root: whatever is still open did not commit
        fences.end(committed=False)
    elif transaction.nested:  # a savepoint: released (above), or rolled back with its fences
        if transaction is not fences.released:
            fences.end(committed=False, savepoint=transaction)
        fences.released = None


def _connection_begin(conn: Any) -> None:
    _CONNECTIONS[conn].committing = []  # a new transaction: the last COMMIT has returned


def _connection_commit(conn: Any) -> None:
    fences = _CONNECTIONS[conn]
    fences.commit_rows(conn)
    fences.committing = fences.end(committed=True)
    for fence in fences.committing:
        fence.tie.committing()


def _connection_rollback(conn: Any) -> None:
    _CONNECTIONS[conn].end(committed=False)


def _connection_rollback_savepoint(conn: Any, name: str, _: Any) -> None:
    _CONNECTIONS[conn].end(committed=False, savepoint=name)


def _connection_error(context: Any) -> None:
    fences = _CONNECTIONS.get(context.connection) if context.connection is not None else None
    if fences is not None and context.statement is None:  # the COMMIT failed, not a statement
        committing, fences.committing = fences.committing, []
        for fence in committing:
            fence.tie.rolled_back()
