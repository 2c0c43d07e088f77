"""The runtime store's read side: what managers published (``pm_managers``, ``pm_entries``,
``pm_schedule_state``) as the API and the dashboard show it, and the per-schedule state a
takeover reads (``DatabaseRuntimeStore.get_state``).

Every function takes a connection (the API's, one per request; the store's own). A manager is
live while its heartbeat is at or after ``alive_after`` (the API's cutoff: three missed
heartbeats); a reaped manager's entries went with it (``ON DELETE CASCADE``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, Select, case, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from periodic_manager.contracts import (
    SENT,
    EntryRecord,
    FailureCount,
    ManagerInfo,
    ManagerStatus,
    StateRecord,
)
from periodic_manager.db import rows as dbrows
from periodic_manager.db.engine import chunks, reads_bytes
from periodic_manager.db.models import (
    entries_table,
    managers_table,
    runs_table,
    schedule_state_table,
)

# Stored counters, one column per run status.
COUNT_COLUMNS = {
    "enqueued": "enqueued_count",
    "duplicate": "duplicate_count",
    "skipped": "skipped_count",
    "failed": "failed_count",
    "held": "held_count",
    "resent": "resent_count",
}
_STATE_NAMES = [c.name for c in schedule_state_table.c]
_E = entries_table.c


def _cols(sqlite: bool, table: Any, prefix: str) -> list[Any]:
    """Every column of ``table`` raw (:func:`periodic_manager.db.rows.raw`: anyone with SQL
    access writes these tables too, so each row is decoded alone), labelled ``prefix`` + name so
    that one joined row names every table's columns without clashes."""
    return [dbrows.raw(sqlite, c).label(f"{prefix}{c.name}") for c in table.c]


@dataclass(frozen=True, slots=True)
class ManagerRecord:
    """A manager as stored: who it is and its last heartbeat."""

    info: ManagerInfo
    status: ManagerStatus


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
        select(*_cols(sqlite, managers_table, "m_"))
        .where(managers_table.c.heartbeat_at >= alive_after)
        .order_by(managers_table.c.is_leader.desc(), managers_table.c.manager_id)
    )
    found = [_manager_record(sqlite, r._mapping) for r in (await conn.execute(stmt)).all()]
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
            *_cols(sqlite, entries_table, "e_"),
            *_cols(sqlite, managers_table, "m_"),
            *_cols(sqlite, schedule_state_table, "s_"),
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
        select(*_cols(sqlite, entries_table, "e_"), *_cols(sqlite, managers_table, "m_"))
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
            managers[m["m_manager_id"]] = _manager_record(sqlite, m)
        manager = managers[m["m_manager_id"]]
        if manager is None:  # its heartbeat cannot be read: not known to be live
            continue
        state = None
        if with_state and m["s_schedule_key"] is not None:
            state = _state_record(sqlite, {name: m[f"s_{name}"] for name in _STATE_NAMES})
        out.append(LiveEntry(manager=manager, entry=_entry_record(sqlite, m), state=state))
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
        stmt = select(*_cols(sqlite, schedule_state_table, "")).where(
            schedule_state_table.c.schedule_key.in_(chunk)
        )
        for row in (await conn.execute(stmt)).all():
            record = _state_record(sqlite, row._mapping)
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
    stmt = (
        select(
            dbrows.raw(sqlite, _E.manager_id),
            dbrows.raw(sqlite, _E.last_error),
            dbrows.raw(sqlite, _E.last_good_since),
        )
        .join(managers_table, managers_table.c.manager_id == entries_table.c.manager_id)
        .where(
            entries_table.c.schedule_key == schedule_key,
            entries_table.c.status == "error",
            managers_table.c.heartbeat_at >= alive_after,
        )
        .order_by(entries_table.c.manager_id, entries_table.c.entry_id)
    )
    return [
        Rejection(_str(m), dbrows.text_of(msg), dbrows.instant_or_none(sqlite, since))
        for m, msg, since in (await conn.execute(stmt)).all()
    ]


async def overlap_of(
    conn: AsyncConnection, schedule_key: str, alive_after: datetime
) -> OverlapReport | None:
    """The held slot and previous task live managers publish for a schedule (options.overlap):
    the leader's first, else the manager that heard from its target last."""
    sqlite = reads_bytes(conn)
    stmt = (
        select(
            dbrows.raw(sqlite, _E.manager_id),
            dbrows.raw(sqlite, _E.held_slot_at),
            dbrows.raw(sqlite, _E.previous_task_id),
            dbrows.raw(sqlite, _E.previous_task_state),
        )
        .join(managers_table, managers_table.c.manager_id == entries_table.c.manager_id)
        .where(
            entries_table.c.schedule_key == schedule_key,
            entries_table.c.status == "active",
            managers_table.c.heartbeat_at >= alive_after,
            or_(
                entries_table.c.held_slot_at.is_not(None),
                entries_table.c.previous_task_state.is_not(None),
            ),
        )
        .order_by(managers_table.c.is_leader.desc(), entries_table.c.manager_id)
        .limit(1)
    )
    row = (await conn.execute(stmt)).first()
    if row is None:
        return None
    manager_id, held, task_id, task_state = row
    return OverlapReport(
        _str(manager_id),
        dbrows.instant_or_none(sqlite, held),
        dbrows.text_of(task_id),
        dbrows.text_of(task_state),
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
    return [(_str(key), dbrows.text_of(message)) for key, message in await conn.execute(stmt)]


# -- row <-> record ------------------------------------------------------------------------------


def _str(value: Any) -> str:
    """A raw text cell of a NOT NULL column."""
    return dbrows.text_of(value) or ""


def _offset(value: Any) -> float | None:
    """A clock offset cell: a finite number, else None (the column is data like any)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _manager_record(sqlite: bool, m: RowMapping) -> ManagerRecord | None:
    """A manager row decoded cell by cell (an unreadable cell is None, or not leading); None
    when its heartbeat cannot be read (then it is not known to be live)."""
    heartbeat_at = dbrows.instant_or_none(sqlite, m["m_heartbeat_at"])
    if heartbeat_at is None:
        return None
    info = ManagerInfo(
        manager_id=_str(m["m_manager_id"]),
        hostname=_str(m["m_hostname"]),
        pid=dbrows.int_of(m["m_pid"]),
        version=_str(m["m_version"]),
        started_at=dbrows.instant_or_none(sqlite, m["m_started_at"]),
    )
    status = ManagerStatus(
        heartbeat_at=heartbeat_at,
        is_leader=dbrows.bool_of(sqlite, m["m_is_leader"]) is True,
        last_sync_at=dbrows.instant_or_none(sqlite, m["m_last_sync_at"]),
        last_sync_error=dbrows.text_of(m["m_last_sync_error"]),
        entry_count=dbrows.int_of(m["m_entry_count"]),
        target_down=dbrows.text_of(m["m_target_down"]),
        clock_offset_s=_offset(m.get("m_clock_offset_s")),
    )
    return ManagerRecord(info=info, status=status)


def _entry_record(sqlite: bool, m: RowMapping) -> EntryRecord:
    def instant(name: str) -> datetime | None:
        return dbrows.instant_or_none(sqlite, m[name])

    return EntryRecord(
        entry_id=_str(m["e_entry_id"]),
        schedule_key=_str(m["e_schedule_key"]),
        name=dbrows.text_of(m["e_name"]),
        content_hash=_str(m["e_content_hash"]),
        status=_str(m["e_status"]),
        registered_at=instant("e_registered_at"),
        spec=dbrows.text_of(m["e_spec"]),
        timezone=dbrows.text_of(m["e_timezone"]),
        anchor=instant("e_anchor"),
        task_type=dbrows.text_of(m["e_task_type"]),
        queue=dbrows.text_of(m["e_queue"]),
        last_error=dbrows.text_of(m["e_last_error"]),
        held_slot=instant("e_held_slot_at"),
        previous_task_id=dbrows.text_of(m["e_previous_task_id"]),
        previous_task_state=dbrows.text_of(m["e_previous_task_state"]),
        last_good_since=instant("e_last_good_since"),
    )


def _state_record(sqlite: bool, m: RowMapping | dict[str, Any]) -> StateRecord:
    """A state row decoded cell by cell: an unreadable instant is None, an unreadable
    counter is left out of ``counts`` (as a status never seen)."""
    counts = {s: dbrows.int_of(m[col]) for s, col in COUNT_COLUMNS.items()}
    return StateRecord(
        schedule_key=_str(m["schedule_key"]),
        name=_str(m["name"]),
        last_slot_at=dbrows.instant_or_none(sqlite, m["last_slot_at"]),
        last_done_at=dbrows.instant_or_none(sqlite, m["last_done_at"]),
        last_enqueued_at=dbrows.instant_or_none(sqlite, m["last_enqueued_at"]),
        last_message_id=dbrows.text_of(m["last_message_id"]),
        last_status=dbrows.text_of(m["last_status"]),
        last_error=dbrows.text_of(m["last_error"]),
        counts={s: n for s, n in counts.items() if n},
        runs=dbrows.int_of(m["runs_count"]) or 0,
    )
