"""``pm_backfill_slots``, what backfills sent: the one reader and writer of the table.

A backfill (:mod:`periodic_manager.backfill`) claims each slot here just before it sends it
(:func:`claim`): an INSERT that does nothing where the slot is there already (ON CONFLICT DO
NOTHING on PostgreSQL and SQLite, a no-op ON DUPLICATE KEY UPDATE on MariaDB/MySQL), so of two backfills racing over
one range only one sends a slot, whatever their rates and however long the target keeps its
claims. A claim is ``sending`` until the target answered (:func:`finish`): ``sent`` when it took
the task (or held its key already), deleted when it did not (another backfill may send it later).
A ``sending`` claim older than :data:`STALE` (its backfill died between claim and answer) is taken
over by the next backfill, which sends the slot again with the same idempotency key.

Rows are kept for ``PM_RUNS_RETENTION`` from ``at`` (:func:`drop_old`, with the run history's
prune) whatever the history's cap per schedule, and deleted with their schedule.

The same transaction also re-reads what the run history records sent among the batch (a manager
sent it live meanwhile) and, for a schedule with ``options.max_runs``, takes the batch's runs from
``pm_schedule_state.runs_count`` under the state row's lock, so racing backfills of a limited
schedule never send more than its runs left between them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import and_, case, delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.contracts import SENT
from periodic_manager.db import history
from periodic_manager.db.engine import backend, chunks, on_sqlite, retried
from periodic_manager.db.models import backfill_slots_table, schedule_state_table
from periodic_manager.db.upsert import upsert
from periodic_manager.schedules.runs import runs_left

SENDING = "sending"
SENT_STATE = "sent"
BACKFILLED = "backfilled"  # the run status of a slot a backfill sent
KNOWN_SENT = (*sorted(SENT), BACKFILLED)  # run statuses that say a slot was sent
# A claim still ``sending`` after this long is its backfill's no more (it died, or its target
# answered nothing): the next backfill takes it over. Far beyond one target call's bound.
STALE = timedelta(minutes=2)
_TICK = timedelta(microseconds=1)
_R = TypeVar("_R")
T = backfill_slots_table.c
S = schedule_state_table.c


@dataclass(frozen=True, slots=True)
class Claimed:
    """A batch's claim: ``mine`` to send now; ``known`` sent already (the history or another
    backfill's record); ``over_limit`` not claimed, the schedule's runs being used up."""

    mine: list[datetime]
    known: set[datetime]
    over_limit: int


async def recorded(
    conn: AsyncConnection, key: str, start: datetime, end: datetime, *, state: str | None = None
) -> set[datetime]:
    """The slots in ``[start, end)`` a backfill claimed (sent, or being sent; only those in
    ``state`` when given), UTC."""
    where = [T.schedule_key == key, T.slot_at >= start, T.slot_at < end]
    return await _slots(conn, where if state is None else [*where, T.state == state])


async def claim(
    engine: AsyncEngine,
    key: str,
    name: str,
    slots: Sequence[datetime],
    owner: str,
    now: datetime,
    max_runs: int | None,
) -> Claimed:
    """Claim for ``owner`` each of ``slots`` (UTC) that no backfill claimed and the
    history does not record sent, at most the runs left of ``max_runs`` (None: no limit)."""
    if not slots:
        return Claimed([], set(), 0)

    async def work(conn: AsyncConnection) -> Claimed:
        # Writes first: on SQLite a transaction that read before it writes may not write at all.
        if max_runs is not None:  # the state row, locked by this write until the commit
            await conn.execute(
                upsert(
                    conn,
                    schedule_state_table,
                    ["schedule_key"],
                    lambda new: [("runs_count", S.runs_count)],
                ),
                {"schedule_key": key, "name": name, "updated_at": now},
            )
        # Sorted: concurrent claims lock their index entries in one order (no deadlock).
        await conn.execute(
            _insert(conn),
            [
                {"schedule_key": key, "slot_at": s, "state": SENDING, "owner": owner, "at": now}
                for s in sorted(slots)
            ],
        )
        lo, hi = min(slots), max(slots) + _TICK
        in_batch = [T.schedule_key == key, T.slot_at >= lo, T.slot_at < hi]
        stale = and_(*in_batch, T.state == SENDING, T.owner != owner, T.at < now - STALE)
        await conn.execute(update(backfill_slots_table).where(stale).values(owner=owner, at=now))
        wanted = set(slots)
        mine = await _slots(conn, [*in_batch, T.owner == owner, T.state == SENDING]) & wanted
        live = await history.slots_with(conn, key, KNOWN_SENT, lo, hi) & mine
        if live:  # sent by a manager meanwhile: remembered as sent, not sent again
            await _set(conn, key, owner, live, values={"state": SENT_STATE})
        ours = sorted(mine - live)
        over = 0
        if max_runs is not None:
            counted = select(S.runs_count).where(S.schedule_key == key)
            if not on_sqlite(conn):  # SQLite: the write above holds the one write lock
                counted = counted.with_for_update()
            row = (await conn.execute(counted)).first()
            left = runs_left(max_runs, int(row[0]) if row is not None and row[0] is not None else 0)
            ours, extra = ours[:left], ours[left:]
            over = len(extra)
            await _set(conn, key, owner, extra, values=None)
            await _add_runs(conn, key, len(ours))
        return Claimed(ours, (wanted - mine) | live, over)

    return await _committed(engine, work)


async def finish(
    engine: AsyncEngine,
    key: str,
    owner: str,
    sent: Iterable[datetime],
    unsent: Iterable[datetime],
    now: datetime,
    *,
    limited: bool,
) -> None:
    """Record ``sent`` as sent (the target took them or held their key) and give ``unsent`` up
    (deleted: another backfill may send them), handing their runs back when ``limited``."""
    sent, unsent = list(sent), list(unsent)
    if not sent and not unsent:
        return

    async def work(conn: AsyncConnection) -> None:
        await _set(conn, key, owner, sent, values={"state": SENT_STATE, "at": now})
        await _set(conn, key, owner, unsent, values=None)
        if limited and unsent:
            await _add_runs(conn, key, -len(unsent))

    await _committed(engine, work)


async def settle(engine: AsyncEngine, key: str, name: str, slot: datetime, now: datetime) -> None:
    """Move the schedule's latest settled slot (``pm_schedule_state.last_done_at``) forward to
    ``slot``, never back: a takeover or a catch-up then sends nothing at or before it, as after
    a slot a manager sent (the caller knows every slot up to it sent)."""

    def assign(new: Any) -> list[tuple[str, Any]]:
        later = or_(S.last_done_at.is_(None), new.last_done_at > S.last_done_at)
        return [("last_done_at", case((later, new.last_done_at), else_=S.last_done_at))]

    async def work(conn: AsyncConnection) -> None:
        await conn.execute(
            upsert(conn, schedule_state_table, ["schedule_key"], assign),
            {"schedule_key": key, "name": name, "last_done_at": slot, "updated_at": now},
        )

    await _committed(engine, work)


async def drop_old(engine: AsyncEngine, cutoff: datetime) -> int:
    """Delete the records with ``at`` before ``cutoff`` (bounded batches); the number deleted."""
    return await history.drop_before(engine, backfill_slots_table, T.id, T.at, cutoff)


# -- helpers --------------------------------------------------------------------------------------


async def _committed(engine: AsyncEngine, work: Callable[[AsyncConnection], Awaitable[_R]]) -> _R:
    """``work`` in a transaction of its own, committed, retried as the database asks
    (:func:`periodic_manager.db.engine.retried`)."""
    async with engine.connect() as conn:

        async def attempt() -> _R:
            done = await work(conn)
            await conn.commit()
            return done

        return await retried(conn, attempt)


def _insert(conn: AsyncConnection) -> Any:
    db = backend(conn)
    if db == "mysql":  # not INSERT IGNORE: its driver logs a warning for every slot there
        from sqlalchemy.dialects import mysql

        return mysql.insert(backfill_slots_table).on_duplicate_key_update(id=T.id)
    if db == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(backfill_slots_table).on_conflict_do_nothing(
            index_elements=[T.schedule_key, T.slot_at]
        )
    from sqlalchemy.dialects import sqlite

    return sqlite.insert(backfill_slots_table).on_conflict_do_nothing()


async def _slots(conn: AsyncConnection, where: list[Any]) -> set[datetime]:
    return await history.instants(conn, T.slot_at, where)


async def _set(
    conn: AsyncConnection,
    key: str,
    owner: str,
    slots: Iterable[datetime],
    *,
    values: dict[str, Any] | None,
) -> None:
    """Update (``values``) or delete (None) ``owner``'s claims of ``slots``."""
    for part in chunks(sorted(set(slots))):
        where = and_(T.schedule_key == key, T.owner == owner, T.slot_at.in_(list(part)))
        table = backfill_slots_table
        stmt = update(table).where(where).values(**values) if values else delete(table).where(where)
        await conn.execute(stmt)


async def _add_runs(conn: AsyncConnection, key: str, n: int) -> None:
    if n:
        await conn.execute(
            update(schedule_state_table)
            .where(S.schedule_key == key)
            .values(runs_count=S.runs_count + n)
        )
