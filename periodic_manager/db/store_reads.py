"""The runtime store's read side: what managers published (``pm_managers``, ``pm_entries``,
``pm_schedule_state``) as the API and the dashboard show it, and the per-schedule state a
takeover reads (``DatabaseRuntimeStore.get_state``).

Every function takes a connection (the API's, one per request; the store's own). A manager is
live while its heartbeat is at or after ``alive_after`` (the API's cutoff: three missed
heartbeats); a reaped manager's entries went with it (``ON DELETE CASCADE``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, case, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from periodic_manager.contracts import SENT, EntryRecord, FailureCount, StateRecord
from periodic_manager.db import rows as dbrows
from periodic_manager.db import runtime_rows as decode
from periodic_manager.db.engine import chunks, reads_bytes
from periodic_manager.db.models import (
    entries_table,
    managers_table,
    runs_table,
    schedule_state_table,
)
from periodic_manager.db.runtime_rows import ManagerRecord

_STATE_NAMES = [c.name for c in schedule_state_table.c]
_E = entries_table.c


@dataclass(frozen=True, slots=True)
class LiveEntry:
    """An entry together with the manager that holds it (for ``GET /entries``), and the stored
    state of its schedule when it was asked for and there is one."""

    manager: ManagerRecord
    entry: EntryRecord
    state: StateRecord | None = None


@dataclass(frozen=True, slots=True)
class Rejection:
    """A live manager's error record of a row (``message``: ``"<field>: <reason>"``), with since
    when it keeps the row's last good version running in its place (None: none runs there)."""

    manager_id: str
    message: str | None
    last_good_since: datetime | None


@dataclass(frozen=True, slots=True)
class OverlapReport:
    """What a live manager published of a schedule's ``options.overlap``: the slot it holds and
    the schedule's previous task as it last saw it."""

    manager_id: str
    held_slot: datetime | None
    previous_task_id: str | None
    previous_task_state: str | None


# -- managers and their entries -------------------------------------------------------------------


async def live_managers(conn: AsyncConnection, alive_after: datetime) -> list[ManagerRecord]:
    """Live managers, the leader first, then by id."""
    sqlite = reads_bytes(conn)
    stmt = (
        select(*decode.columns(sqlite, managers_table, "m_"))
        .where(managers_table.c.heartbeat_at >= alive_after)
        .order_by(managers_table.c.is_leader.desc(), managers_table.c.manager_id)
    )
    found = [decode.manager_record(sqlite, r._mapping) for r in (await conn.execute(stmt)).all()]
    live = [m for m in found if m is not None]
    # The leader first by the judged is_leader (the ORDER BY saw the stored value).
    return sorted(live, key=lambda m: not m.status.is_leader)


async def live_counts(conn: AsyncConnection, alive_after: datetime) -> tuple[int, int]:
    """How many managers are live, and how many of them lead (counted by the database: no row
    is read, so no stored value can fail the count). ``is_leader`` counts when judged true
    (:func:`periodic_manager.db.rows.bool_is`)."""
    leads = dbrows.bool_is(reads_bytes(conn), managers_table.c.is_leader, True)
    stmt = select(func.count(), func.coalesce(func.sum(case((leads, 1), else_=0)), 0)).where(
        managers_table.c.heartbeat_at >= alive_after
    )
    live, leaders = (await conn.execute(stmt)).one()
    return int(live), int(leaders)


async def live_entries(
    conn: AsyncConnection, alive_after: datetime, schedule_key: str | None = None
) -> list[LiveEntry]:
    """Entries of live managers (of one schedule if ``schedule_key`` is given), each with its
    manager and its schedule's stored state. One query; ordered by schedule key, manager and entry
    id, so listings are stable."""
    sqlite = reads_bytes(conn)
    stmt = (
        select(
            *decode.columns(sqlite, entries_table, "e_"),
            *decode.columns(sqlite, managers_table, "m_"),
            *decode.columns(sqlite, schedule_state_table, "s_"),
        )
        .join_from(
            entries_table, managers_table, managers_table.c.manager_id == entries_table.c.manager_id
        )
        .outerjoin(
            schedule_state_table,
            schedule_state_table.c.schedule_key == entries_table.c.schedule_key,
        )
        .where(managers_table.c.heartbeat_at >= alive_after)
    )
    if schedule_key is not None:
        stmt = stmt.where(entries_table.c.schedule_key == schedule_key)
    stmt = stmt.order_by(
        entries_table.c.schedule_key, entries_table.c.manager_id, entries_table.c.entry_id
    )
    return _live_entries(sqlite, (await conn.execute(stmt)).all(), with_state=True)


async def entry_page(
    conn: AsyncConnection,
    alive_after: datetime,
    *,
    manager_id: str | None,
    status: str | None,
    limit: int,
    offset: int,
) -> tuple[int, list[LiveEntry]]:
    """How many entries of live managers (of ``manager_id``, with ``status``, when given) there
    are, and a page of them: rejected rows first, then by name, manager and entry id."""
    conds = [managers_table.c.heartbeat_at >= alive_after]
    if manager_id is not None:
        conds.append(entries_table.c.manager_id == manager_id)
    if status is not None:
        conds.append(entries_table.c.status == status)
    total = (
        await conn.execute(
            select(func.count())
            .select_from(entries_table)
            .join(managers_table, managers_table.c.manager_id == entries_table.c.manager_id)
            .where(*conds)
        )
    ).scalar_one()
    sqlite = reads_bytes(conn)
    stmt = (
        select(
            *decode.columns(sqlite, entries_table, "e_"),
            *decode.columns(sqlite, managers_table, "m_"),
        )
        .join_from(
            entries_table, managers_table, managers_table.c.manager_id == entries_table.c.manager_id
        )
        .where(*conds)
        .order_by(
            case((entries_table.c.status == "error", 0), else_=1),
            entries_table.c.name,
            entries_table.c.manager_id,
            entries_table.c.entry_id,
        )
        .limit(limit)
        .offset(offset)
    )
    return int(total), _live_entries(sqlite, (await conn.execute(stmt)).all(), with_state=False)


def _live_entries(sqlite: bool, rows: Sequence[Any], *, with_state: bool) -> list[LiveEntry]:
    managers: dict[Any, ManagerRecord | None] = {}
    out: list[LiveEntry] = []
    for row in rows:
        m = row._mapping
        if m["m_manager_id"] not in managers:
            managers[m["m_manager_id"]] = decode.manager_record(sqlite, m)
        manager = managers[m["m_manager_id"]]
        if manager is None:  # its heartbeat cannot be read: not known to be live
            continue
        state = None
        if with_state and m["s_schedule_key"] is not None:
            state = decode.state_record(sqlite, {name: m[f"s_{name}"] for name in _STATE_NAMES})
        out.append(LiveEntry(manager=manager, entry=decode.entry_record(sqlite, m), state=state))
    return out


async def entry_tallies(
    conn: AsyncConnection, manager_ids: Sequence[str]
) -> dict[str, tuple[int, int]]:
    """Per manager: how many of its entries are active, and how many are rejected rows."""
    by_status = (
        select(
            entries_table.c.manager_id,
            func.sum(case((entries_table.c.status == "error", 0), else_=1)),
            func.sum(case((entries_table.c.status == "error", 1), else_=0)),
        )
        .where(entries_table.c.manager_id.in_(manager_ids))
        .group_by(entries_table.c.manager_id)
    )
    return {m: (int(a), int(e)) for m, a, e in await conn.execute(by_status)}


# -- one schedule ---------------------------------------------------------------------------------


async def states(conn: AsyncConnection, schedule_keys: Iterable[str]) -> dict[str, StateRecord]:
    """Stored state of the given schedules (absent keys are simply missing).

    ``counts`` holds only the statuses seen, as the memory store's does.
    """
    keys = list(dict.fromkeys(schedule_keys))
    sqlite = reads_bytes(conn)
    out: dict[str, StateRecord] = {}
    for chunk in chunks(keys):
        stmt = select(*decode.columns(sqlite, schedule_state_table, "")).where(
            schedule_state_table.c.schedule_key.in_(chunk)
        )
        for row in (await conn.execute(stmt)).all():
            record = decode.state_record(sqlite, row._mapping)
            out[record.schedule_key] = record
    return out


async def failure_count(conn: AsyncConnection, schedule_key: str, limit: int) -> FailureCount:
    """``options.pause_after_failures``: the stored count of ``schedule_key`` and at most
    ``limit`` runs sent after the slot counted last, oldest first. Read raw: an unreadable count
    is 0, an unreadable slot is not counted past, a run whose slot cannot be read is left out."""
    sqlite = reads_bytes(conn)
    s = schedule_state_table.c
    stmt = select(
        dbrows.raw(sqlite, s.consecutive_failures), dbrows.raw(sqlite, s.failures_checked_at)
    )
    row = (await conn.execute(stmt.where(s.schedule_key == schedule_key))).first()
    failures = dbrows.int_of(row[0]) if row is not None else None
    checked = dbrows.instant_or_none(sqlite, row[1]) if row is not None else None
    r = runs_table.c
    runs = select(dbrows.raw(sqlite, r.slot_at), dbrows.raw(sqlite, r.message_id)).where(
        r.schedule_key == schedule_key, r.status.in_(sorted(SENT))
    )
    if checked is not None:
        runs = runs.where(r.slot_at > checked)
    found: list[tuple[datetime, str | None]] = []
    seen: set[datetime] = set()
    for raw_slot, message_id in (
        await conn.execute(runs.order_by(r.slot_at, r.id).limit(limit))
    ).all():
        slot = dbrows.instant_or_none(sqlite, raw_slot)
        if slot is not None and slot not in seen:  # a slot found duplicate is one task
            seen.add(slot)
            found.append((slot, dbrows.text_of(message_id)))
    bounded = failures if failures is not None and 0 <= failures <= 10**9 else 0
    return FailureCount(bounded, checked, found)


async def rejections_of(
    conn: AsyncConnection, schedule_key: str, alive_after: datetime
) -> list[Rejection]:
    """The error records live managers published for a schedule, by manager."""
    sqlite = reads_bytes(conn)
    cells = (_E.manager_id, _E.last_error, _E.last_good_since)
    stmt = _published(sqlite, schedule_key, alive_after, "error", cells).order_by(
        entries_table.c.manager_id, entries_table.c.entry_id
    )
    return [
        Rejection(decode.text(m), dbrows.text_of(msg), dbrows.instant_or_none(sqlite, since))
        for m, msg, since in (await conn.execute(stmt)).all()
    ]


async def overlap_of(
    conn: AsyncConnection, schedule_key: str, alive_after: datetime
) -> OverlapReport | None:
    """The held slot and previous task live managers publish for a schedule (options.overlap):
    the leader's first, else the manager that heard from its target last."""
    sqlite = reads_bytes(conn)
    cells = (_E.manager_id, _E.held_slot_at, _E.previous_task_id, _E.previous_task_state)
    stmt = (
        _published(sqlite, schedule_key, alive_after, "active", cells)
        .where(or_(_E.held_slot_at.is_not(None), _E.previous_task_state.is_not(None)))
        .order_by(managers_table.c.is_leader.desc(), entries_table.c.manager_id)
        .limit(1)
    )
    row = (await conn.execute(stmt)).first()
    if row is None:
        return None
    manager_id, held, task_id, task_state = row
    return OverlapReport(
        decode.text(manager_id),
        dbrows.instant_or_none(sqlite, held),
        dbrows.text_of(task_id),
        dbrows.text_of(task_state),
    )


def _published(
    sqlite: bool, schedule_key: str, alive_after: datetime, status: str, cells: Sequence[Any]
) -> Select:
    """``cells`` (read raw) of the entries of ``status`` live managers published for a schedule."""
    return (
        select(*(dbrows.raw(sqlite, cell) for cell in cells))
        .join(managers_table, managers_table.c.manager_id == entries_table.c.manager_id)
        .where(
            entries_table.c.schedule_key == schedule_key,
            entries_table.c.status == status,
            managers_table.c.heartbeat_at >= alive_after,
        )
    )


# -- rows that live managers rejected -------------------------------------------------------------


def rejected(alive_after: datetime) -> Select:
    """Schedule keys (with the reason) that a live manager rejected."""
    return (
        select(entries_table.c.schedule_key, entries_table.c.last_error)
        .join(managers_table, managers_table.c.manager_id == entries_table.c.manager_id)
        .where(entries_table.c.status == "error", managers_table.c.heartbeat_at >= alive_after)
    )


async def rejections(
    conn: AsyncConnection, schedule_keys: Sequence[str], alive_after: datetime
) -> list[tuple[str, str | None]]:
    """(schedule key, reason) of each rejection of these schedules by a live manager, by
    manager."""
    sqlite = reads_bytes(conn)
    stmt = (
        rejected(alive_after)
        .with_only_columns(dbrows.raw(sqlite, _E.schedule_key), dbrows.raw(sqlite, _E.last_error))
        .where(entries_table.c.schedule_key.in_(schedule_keys))
        .order_by(entries_table.c.manager_id)
    )
    return [
        (decode.text(key), dbrows.text_of(message)) for key, message in await conn.execute(stmt)
    ]
