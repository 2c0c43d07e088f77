"""``pm_entries`` written: a manager's entries upserted and removed, in the caller's
transaction (the store's :meth:`~periodic_manager.db.store.DatabaseRuntimeStore.apply_entries`).
A cold start publishes 100,000 of them: on PostgreSQL with asyncpg they are copied in (binary
COPY) and merged in one statement, elsewhere upserted in slices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, text
from sqlalchemy.ext.asyncio import AsyncConnection

from periodic_manager.contracts import EntryRecord
from periodic_manager.db.engine import chunks
from periodic_manager.db.models import entries_table
from periodic_manager.db.upsert import upsert

_UPSERT_CHUNK = 5000  # entry rows per executemany


# The cold-start path of apply_entries on PostgreSQL: COPY into a table dropped at commit, then
# one INSERT .. ON CONFLICT from it (COPY alone cannot replace a row already there).
_ENTRY_COLUMNS = tuple(c.name for c in entries_table.c)
# The columns of a copied row: the manager id, then an EntryRecord's fields.
_ENTRY_COPIED = (
    "manager_id",
    *("held_slot_at" if f == "held_slot" else f for f in EntryRecord._fields),
)
assert sorted(_ENTRY_COPIED) == sorted(_ENTRY_COLUMNS), "pm_entries and EntryRecord disagree"
_TASK_ID: int = entries_table.c.previous_task_id.type.length  # type: ignore[attr-defined]  # cut to it
_ENTRY_STAGED = "pm_entries_in"
_ENTRY_STAGE = f"CREATE TEMP TABLE {_ENTRY_STAGED} (LIKE {entries_table.name}) ON COMMIT DROP"
_ENTRY_MERGE = (
    f"INSERT INTO {entries_table.name} SELECT * FROM {_ENTRY_STAGED}"
    " ON CONFLICT (manager_id, entry_id) DO UPDATE SET "
    + ", ".join(
        f"{c} = EXCLUDED.{c}" for c in _ENTRY_COLUMNS if c not in ("manager_id", "entry_id")
    )
)


def _values(manager_id: str, rec: EntryRecord) -> dict[str, Any]:
    return {
        "manager_id": manager_id,
        "entry_id": rec.entry_id,
        "schedule_key": rec.schedule_key,
        "name": rec.name,
        "content_hash": rec.content_hash,
        "status": rec.status,
        "spec": rec.spec,
        "timezone": rec.timezone,
        "anchor": rec.anchor,
        "task_type": rec.task_type,
        "queue": rec.queue,
        "last_error": rec.last_error,
        "registered_at": rec.registered_at,
        "held_slot_at": rec.held_slot,
        "previous_task_id": rec.previous_task_id[:_TASK_ID] if rec.previous_task_id else None,
        "previous_task_state": rec.previous_task_state,
        "last_good_since": rec.last_good_since,
    }


async def apply(
    conn: AsyncConnection,
    manager_id: str,
    upserts: Sequence[EntryRecord],
    removed: Sequence[str],
    *,
    copy: bool,
) -> None:
    """Delete ``removed`` entry ids of ``manager_id`` and insert or replace ``upserts`` (with
    ``copy``: through COPY, PostgreSQL with asyncpg)."""
    for chunk in chunks(removed):
        await conn.execute(
            delete(entries_table).where(
                entries_table.c.manager_id == manager_id,
                entries_table.c.entry_id.in_(chunk),
            )
        )
    if upserts and copy:
        await _copy_in(conn, manager_id, upserts)
    elif upserts:
        stmt = upsert(
            conn,
            entries_table,
            ["manager_id", "entry_id"],
            lambda new: [
                (c.name, new[c.name])
                for c in entries_table.c
                if c.name not in ("manager_id", "entry_id")
            ],
        )
        # In slices, each built just before it is sent: every statement stays well inside
        # the driver's command timeout, and the event loop is never held for long, even
        # when a cold start publishes 100,000 entries.
        for i in range(0, len(upserts), _UPSERT_CHUNK):
            rows = [_values(manager_id, r) for r in upserts[i : i + _UPSERT_CHUNK]]
            await conn.execute(stmt, rows)


async def _copy_in(conn: AsyncConnection, manager_id: str, upserts: Sequence[EntryRecord]) -> None:
    """PostgreSQL with asyncpg: ``upserts`` copied (binary COPY) into a table of this
    transaction, then merged in one statement. The values skip SQLAlchemy's per-row parameter
    processing, the cost that kept a manager busy for seconds after a cold start while it
    published its 100,000 entries."""
    await conn.execute(text(_ENTRY_STAGE))  # through SQLAlchemy: its transaction begins
    raw = await conn.get_raw_connection()
    mine = (manager_id,)
    for i in range(0, len(upserts), _UPSERT_CHUNK):  # a republication of everything in slices
        # A record is the row (its fields in _ENTRY_COPIED's order), after the manager id,
        # made as COPY encodes it (a list of them would double the publisher's peak).
        records = (
            mine + r
            if r.previous_task_id is None or 0 < len(r.previous_task_id) <= _TASK_ID
            else mine + r._replace(previous_task_id=r.previous_task_id[:_TASK_ID] or None)
            for r in upserts[i : i + _UPSERT_CHUNK]
        )
        await raw.driver_connection.copy_records_to_table(  # type: ignore[union-attr]
            _ENTRY_STAGED, records=records, columns=_ENTRY_COPIED
        )
    await conn.execute(text(_ENTRY_MERGE))
