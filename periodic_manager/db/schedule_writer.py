"""The one writer of ``periodic_jobs`` rows in this code base: the API's edits and the import.

What every write of a row gets here, and nowhere else:

* **stamps**: a new row is born at ``now`` (``created_at``, ``updated_at``, ``effective_at``,
  and ``paused_at`` with ``paused_by`` when it is created paused);
  a change gets ``updated_at = now``, and ``effective_at = now`` when it gives the schedule new
  slots or keys (a :data:`TIMING` column) or resumes it, so no look back of a manager (a
  takeover re-sending the last ``grace``, a ``fire_once`` catch-up) reaches before the edit.
  A pause gets ``paused_at = now`` and ``paused_by`` (``api``, ``import``), a resume clears
  them with ``paused_note``. The triggers of migrations 0004 and 0009 keep values a statement
  sets, and stamp plain SQL edits alike.
* **names**: a name another row holds is a :class:`~periodic_manager.errors.NameConflict`, found
  before the write, or raised by the unique index when a concurrent writer won the race.
* **locking**: the API's check-merge-write (If-Match, a PATCH merged over the stored row) reads
  the row with :func:`lock`: on PostgreSQL the row is locked until commit; SQLite has no row
  locks, so the database's write lock is taken first.
* **deletion**: a deleted row takes its runtime state, its run history and its last good version
  with it (nothing else keys them to the row, and ids are never reused). Its change history
  stays, until the manager prunes it.
* **authorship**: every write is marked with its :class:`~periodic_manager.db.change_history.Author`
  (``api``, ``import``, ``manager``), so the change history the triggers of migration 0012 write
  says who made it (:func:`_authored`); a statement not written here is recorded as ``sql``.

Writing a column *as stored* (:class:`RowWrite` ``stored``, the import of a row with errors) goes
past the column's type: see :func:`periodic_manager.db.stored.bind`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import delete, false, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.db import change_history
from periodic_manager.db import rows as dbrows
from periodic_manager.db.change_history import API, IMPORT, Author
from periodic_manager.db.engine import backend, chunks, on_sqlite, reads_bytes
from periodic_manager.db.models import (
    backfill_slots_table,
    jobs_table,
    last_good_table,
    runs_table,
    schedule_state_table,
)
from periodic_manager.db.schedule_reader import select_rows
from periodic_manager.db.stored import Raw, bind
from periodic_manager.errors import ConfigError, NameConflict

T = jobs_table.c
_ENABLED = dbrows.FIELDS.index("enabled")

# Columns whose change gives a schedule new slots or keys: writing one (or resuming) moves the
# row's ``effective_at`` to the writer's now, so no look back of a manager reaches before the edit.
TIMING = frozenset({"name", "spec", "timezone", "anchor"})


def born(now: datetime, fields: Mapping[str, Any], *, by: str = "api") -> dict[str, Any]:
    """The stamps of a row ``fields`` inserted at ``now`` (one created paused: paused by ``by``)."""
    out: dict[str, Any] = {"created_at": now, "updated_at": now, "effective_at": now}
    if fields.get("enabled") is False:
        out.update(paused_at=now, paused_by=by)
    return out


def stamps(
    written: Mapping[str, Any], was_enabled: Any, now: datetime, *, by: str = "api"
) -> dict[str, Any]:
    """``updated_at`` (and ``effective_at`` when the timing changes or the row resumes) of a write
    of the columns ``written``, by the writer's clock (the triggers of migration 0004 keep values
    a statement sets). ``was_enabled``: the row's ``enabled`` before (None: unreadable).

    A pause (``enabled`` to false) is stamped ``paused_at = now``, ``paused_by = by`` and no note;
    a resume clears the three (the triggers of migration 0009 keep values a statement sets)."""
    out: dict[str, Any] = {"updated_at": now}
    enabled = written.get("enabled")
    if TIMING & written.keys() or (enabled is True and was_enabled is not True):
        out["effective_at"] = now
    if enabled is False and was_enabled is not False:
        out.update(paused_note=None, paused_at=now, paused_by=by)
    elif enabled is True and was_enabled is not True:
        out.update(paused_note=None, paused_at=None, paused_by=None)
    return out


# -- the API: one row, one transaction ------------------------------------------------------------


async def lock(conn: AsyncConnection, schedule_id: int) -> tuple[Any, ...] | None:
    """The raw row (every column), held until :func:`release` or the write commits, so that a
    check-merge-write is atomic against any other writer (another API process, plain SQL); None
    when there is no such row.

    PostgreSQL and MariaDB/MySQL: the row is locked. SQLite has no row locks and ignores FOR
    UPDATE: a write that touches nothing takes the database's write lock first, held to commit.
    """
    if on_sqlite(conn):
        await _write_lock(conn)
    stmt = select_rows(reads_bytes(conn), T.id == schedule_id).with_for_update()
    raws = [tuple(r) for r in (await conn.execute(stmt)).all()]
    return raws[0] if raws else None


async def _write_lock(conn: AsyncConnection) -> None:
    """SQLite: take the database's write lock (held to commit) with a write that touches nothing."""
    await conn.execute(update(jobs_table).where(false()).values(id=jobs_table.c.id))


@asynccontextmanager
async def _authored(conn: AsyncConnection, author: Author, now: datetime) -> AsyncIterator[None]:
    """The statements run inside are ``author``'s in the change history (before the commit).
    SQLite: the write lock is taken first, so the entries added inside are this transaction's.
    MariaDB/MySQL: the marks are session variables, cleared whatever happens inside."""
    if on_sqlite(conn):
        await _write_lock(conn)
    since = await change_history.mark(conn, author, now)
    try:
        yield
        await change_history.stamp(conn, author, now, since)
    finally:
        with contextlib.suppress(Exception):  # a broken connection is not reused anyway
            await change_history.unmark(conn)


async def release(conn: AsyncConnection) -> None:
    """End the transaction (and its row lock) without writing."""
    await conn.rollback()


async def create(
    conn: AsyncConnection, fields: Mapping[str, Any], now: datetime, *, author: Author = API
) -> int:
    """Insert a validated row born at ``now`` and commit; its id. NameConflict when the name is
    taken."""
    name = fields["name"]
    if await _name_taken(conn, name):
        raise NameConflict(name)
    stmt = insert(jobs_table).values(**fields, **born(now, fields, by=author.source))
    return int((await _commit(conn, stmt.returning(T.id), name, author, now)).scalar_one())


async def update_row(
    conn: AsyncConnection,
    schedule_id: int,
    changes: Mapping[str, Any],
    *,
    was_enabled: Any,
    name: str,
    now: datetime,
    author: Author = API,
) -> None:
    """Write ``changes`` (validated, and only what differs) with their stamps, and commit.
    ``name``: the row's name after the write; a rename to a name another row holds is a
    NameConflict."""
    if "name" in changes and await _name_taken(conn, changes["name"], schedule_id):
        raise NameConflict(changes["name"])
    written = {**changes, **stamps(changes, was_enabled, now, by=author.source)}
    stmt = update(jobs_table).where(T.id == schedule_id).values(**written)
    await _commit(conn, stmt, name, author, now)


async def set_enabled(
    conn: AsyncConnection,
    schedule_id: int,
    enabled: bool,
    *,
    was_enabled: Any,
    now: datetime,
    note: str | None = None,
    author: Author = API,
) -> None:
    """Pause (with ``note``, stamped as paused by the author's source) or resume the row (with
    its stamps), and commit."""
    by = author.source
    written = {"enabled": enabled, **stamps({"enabled": enabled}, was_enabled, now, by=by)}
    if not enabled:
        written["paused_note"] = note
    async with _authored(conn, author, now):
        await conn.execute(update(jobs_table).where(T.id == schedule_id).values(**written))
    await conn.commit()


class ManagerPauser:
    """Pauses a schedule on behalf of a manager (``options.pause_after_failures``): the
    :class:`~periodic_manager.contracts.Pauser` of the database, written as every pause is
    (stamped ``paused_by = 'manager'``, its note, the change history's source ``manager`` with the
    manager's id as actor)."""

    def __init__(self, engine: AsyncEngine, now: Callable[[], datetime]) -> None:
        self.engine = engine
        self.now = now

    async def pause(self, schedule_key: str, note: str, manager_id: str) -> bool:
        if not schedule_key.isdigit() or len(schedule_key) > 18:
            return False  # not a row's key (a schedule registered from code)
        schedule_id = int(schedule_key)
        async with self.engine.connect() as conn:
            raw = await lock(conn, schedule_id)
            try:
                enabled = raw is not None and dbrows.judge_enabled(reads_bytes(conn), raw[_ENABLED])
            except ConfigError:
                enabled = False  # a row error: no manager runs it
            if not enabled:
                await release(conn)
                return False
            await set_enabled(
                conn,
                schedule_id,
                False,
                was_enabled=True,
                now=self.now(),
                note=note,
                author=Author("manager", manager_id),
            )
        return True


async def delete_row(
    conn: AsyncConnection, schedule_id: int, now: datetime, *, author: Author = API
) -> None:
    """Delete the row with its runtime state, run history and last good version, and commit
    (its change history stays)."""
    async with _authored(conn, author, now):
        await delete_rows(conn, [schedule_id])
    await conn.commit()


async def _name_taken(conn: AsyncConnection, name: str, other_than: int | None = None) -> bool:
    stmt = select(T.id).where(T.name == name)
    if other_than is not None:
        stmt = stmt.where(T.id != other_than)
    return (await conn.execute(stmt.limit(1))).first() is not None


async def _commit(
    conn: AsyncConnection, stmt: Any, name: str, author: Author, now: datetime
) -> Any:
    """Execute as ``author`` and commit; a unique violation on the name (a concurrent writer won
    the race) is a NameConflict."""
    try:
        async with _authored(conn, author, now):
            result = await conn.execute(stmt)
        await conn.commit()
        return result
    except IntegrityError as exc:
        await conn.rollback()
        if "name" in str(exc.orig):
            raise NameConflict(name) from None
        raise


async def delete_rows(conn: AsyncConnection, ids: Sequence[int]) -> None:
    """Delete the rows ``ids`` and what is kept of them by schedule key: runtime state, run
    history, backfill records, last good versions (in the caller's transaction; their change history stays)."""
    for part in chunks(list(dict.fromkeys(ids))):  # IN (...) lists within the driver's limit
        keys = [str(i) for i in part]
        await conn.execute(delete(jobs_table).where(T.id.in_(part)))
        await conn.execute(
            delete(schedule_state_table).where(schedule_state_table.c.schedule_key.in_(keys))
        )
        await conn.execute(delete(runs_table).where(runs_table.c.schedule_key.in_(keys)))
        await conn.execute(
            delete(backfill_slots_table).where(backfill_slots_table.c.schedule_key.in_(keys))
        )
        await conn.execute(delete(last_good_table).where(last_good_table.c.schedule_key.in_(keys)))


# -- the import: many rows, one transaction -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RowWrite:
    """A row as the import writes it: columns as values, and columns as stored (bytes written
    past the column's type, a row with errors restored byte for byte).

    A new row (``row_id`` None) is born at the import's now, unless ``stored`` gives its
    timestamps. A change names only the columns that differ; ``was_enabled`` is the row's
    ``enabled`` before (for the resume rule), and ``updated_at`` the stored ``updated_at`` the
    file gives, written last so that it holds whatever the edit stamps.
    """

    values: Mapping[str, Any]
    stored: Mapping[str, Raw] = field(default_factory=dict)
    row_id: int | None = None
    was_enabled: Any = None
    updated_at: Raw | None = None


async def write_import(
    engine: AsyncEngine,
    rows: Sequence[RowWrite],
    delete_ids: Sequence[int],
    now: datetime,
) -> None:
    """Write ``rows`` (new ones and changes, in order) and delete ``delete_ids`` with what is kept
    of them, in one transaction. A change writes only its columns (by id; no row is loaded, so no
    stored value can get in the way)."""
    db = backend(engine)
    async with engine.begin() as conn, _authored(conn, IMPORT, now):
        for row in rows:
            stored = {c: bind(c, r, db) for c, r in row.stored.items()}
            if row.row_id is None:
                stamped = born(now, row.values, by=IMPORT.source)
                await conn.execute(insert(jobs_table).values(**{**row.values, **stamped, **stored}))
                continue
            written = {**row.values, **stored}
            # New slots or keys, or a resume: nothing before now may be looked back at.
            values = {**stamps(written, row.was_enabled, now, by=IMPORT.source), **written}
            await conn.execute(update(jobs_table).where(T.id == row.row_id).values(**values))
            if row.updated_at is not None:
                # Written again alone: the edit above has the triggers stamp it (0004).
                stamp = bind("updated_at", row.updated_at, db)
                await conn.execute(
                    update(jobs_table).where(T.id == row.row_id).values(updated_at=stamp)
                )
        if delete_ids:
            await delete_rows(conn, delete_ids)
