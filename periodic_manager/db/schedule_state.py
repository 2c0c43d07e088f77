"""``pm_schedule_state`` written: a batch of runs folded per schedule into a delta, merged into
the stored rows by one upsert with the rules of :meth:`StateRecord.fold
<periodic_manager.contracts.StateRecord.fold>` (the counts added, the last slot and the last
settled slot only ever moving forward), and ``options.max_runs`` counted once per slot. The
store's :meth:`~periodic_manager.db.store.DatabaseRuntimeStore.record_runs` drives it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, literal_column, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.contracts import SENT, RunRecord, StateRecord
from periodic_manager.db.engine import chunks, on_sqlite
from periodic_manager.db.models import COUNT_COLUMNS, schedule_state_table
from periodic_manager.db.upsert import upsert


def values(delta: StateRecord, updated_at: datetime) -> dict[str, Any]:
    """The row of a batch's delta of one schedule, written at ``updated_at``."""
    row: dict[str, Any] = {
        "schedule_key": delta.schedule_key,
        "name": delta.name,
        "last_slot_at": delta.last_slot_at,
        "last_done_at": delta.last_done_at,
        "last_enqueued_at": delta.last_enqueued_at,
        "last_message_id": delta.last_message_id,
        "last_status": delta.last_status,
        "last_error": delta.last_error,
        "updated_at": updated_at,
    }
    for status, col in COUNT_COLUMNS.items():
        row[col] = delta.counts.get(status, 0)
    row["runs_count"] = delta.runs
    return row


def upsert_statement(bind: AsyncEngine | AsyncConnection) -> Any:
    """The upsert that merges a batch's deltas (rows of :func:`values`) into the stored rows."""
    t = schedule_state_table.c
    return upsert(bind, schedule_state_table, ["schedule_key"], lambda new: _assign(t, new))


def _assign(t: Any, new: Any) -> list[tuple[str, Any]]:
    """The columns of a schedule's state merged with a batch's delta ``new``; ``last_slot_at``,
    which the conditions of others read, is assigned last (db/upsert.py)."""
    # The batch moved the last slot iff it had an enqueued/duplicate run (then the delta's
    # last_slot_at is set); like StateRecord.fold, an equal slot replaces (the later run wins).
    moves = and_(
        new.last_slot_at.is_not(None),
        or_(t.last_slot_at.is_(None), new.last_slot_at >= t.last_slot_at),
    )
    # The batch decided last_error iff it had an enqueued, duplicate or failed run: the
    # delta then holds the outcome of the last one (None clears); skipped runs leave it.
    # (No bound parameter in the update part: asyncmy's executemany cannot take one there.)
    decides_error = (
        new.enqueued_count + new.duplicate_count + new.resent_count + new.failed_count
    ) > literal_column("0")
    set_: list[tuple[str, Any]] = [
        ("name", new.name),
        ("last_status", new.last_status),
        ("updated_at", new.updated_at),
        # The latest settled slot only ever moves forward.
        (
            "last_done_at",
            case(
                (
                    and_(
                        new.last_done_at.is_not(None),
                        or_(t.last_done_at.is_(None), new.last_done_at > t.last_done_at),
                    ),
                    new.last_done_at,
                ),
                else_=t.last_done_at,
            ),
        ),
        ("last_enqueued_at", case((moves, new.last_enqueued_at), else_=t.last_enqueued_at)),
        ("last_message_id", case((moves, new.last_message_id), else_=t.last_message_id)),
        ("last_error", case((decides_error, new.last_error), else_=t.last_error)),
    ]
    set_ += [(col, t[col] + new[col]) for col in COUNT_COLUMNS.values()]
    set_.append(("runs_count", t.runs_count + new.runs_count))
    set_.append(("last_slot_at", case((moves, new.last_slot_at), else_=t.last_slot_at)))
    return set_


async def count_runs(
    conn: AsyncConnection,
    keys: list[str],
    runs: Sequence[RunRecord],
    deltas: dict[str, StateRecord],
) -> None:
    """Set the delta's ``runs`` of each limited schedule in ``keys`` to its distinct slots
    recorded sent after the stored settled slot (read under a row lock on PostgreSQL, in
    the transaction that moves it): a slot found duplicate after a takeover, or recorded by
    two managers, counts once."""
    t = schedule_state_table.c
    done: dict[str, datetime | None] = {}
    for chunk in chunks(keys):
        stmt = select(t.schedule_key, t.last_done_at).where(t.schedule_key.in_(chunk))
        if not on_sqlite(conn):
            stmt = stmt.with_for_update()
        done.update((k, at) for k, at in (await conn.execute(stmt)).all())
    wanted = set(keys)
    slots: dict[str, set[datetime]] = {}
    for run in runs:
        key = run.schedule_key
        if run.limited and run.status in SENT and key in wanted:
            at = done.get(key)
            if at is None or run.slot > at:
                slots.setdefault(key, set()).add(run.slot)
    for key in keys:
        deltas[key].runs = len(slots.get(key, ()))
