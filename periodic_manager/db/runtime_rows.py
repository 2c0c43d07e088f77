"""Rows of the runtime tables (``pm_managers``, ``pm_entries``, ``pm_schedule_state``) decoded
into records, cell by cell: managers write these tables, and so may anyone with SQL access, so
a cell that cannot be read is unknown (None, or left out), never an error that fails the read
of the others (the cells themselves: :mod:`periodic_manager.db.rows`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping

from periodic_manager.contracts import EntryRecord, ManagerInfo, ManagerStatus, StateRecord
from periodic_manager.db import rows as dbrows
from periodic_manager.db.models import COUNT_COLUMNS


@dataclass(frozen=True, slots=True)
class ManagerRecord:
    """A manager as stored: who it is and its last heartbeat."""

    info: ManagerInfo
    status: ManagerStatus


def columns(sqlite: bool, table: Any, prefix: str) -> list[Any]:
    """Every column of ``table`` raw (:func:`periodic_manager.db.rows.raw`: anyone with SQL
    access writes these tables too, so each row is decoded alone), labelled ``prefix`` + name so
    that one joined row names every table's columns without clashes."""
    return [dbrows.raw(sqlite, c).label(f"{prefix}{c.name}") for c in table.c]


def text(value: Any) -> str:
    """A raw text cell of a NOT NULL column."""
    return dbrows.text_of(value) or ""


def _offset(value: Any) -> float | None:
    """A clock offset cell: a finite number, else None (the column is data like any)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def manager_record(sqlite: bool, m: RowMapping) -> ManagerRecord | None:
    """A manager row decoded cell by cell (an unreadable cell is None, or not leading); None
    when its heartbeat cannot be read (then it is not known to be live)."""
    heartbeat_at = dbrows.instant_or_none(sqlite, m["m_heartbeat_at"])
    if heartbeat_at is None:
        return None
    info = ManagerInfo(
        manager_id=text(m["m_manager_id"]),
        hostname=text(m["m_hostname"]),
        pid=dbrows.int_of(m["m_pid"]),
        version=text(m["m_version"]),
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


def entry_record(sqlite: bool, m: RowMapping) -> EntryRecord:
    def instant(name: str) -> datetime | None:
        return dbrows.instant_or_none(sqlite, m[name])

    return EntryRecord(
        entry_id=text(m["e_entry_id"]),
        schedule_key=text(m["e_schedule_key"]),
        name=dbrows.text_of(m["e_name"]),
        content_hash=text(m["e_content_hash"]),
        status=text(m["e_status"]),
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


def state_record(sqlite: bool, m: RowMapping | dict[str, Any]) -> StateRecord:
    """A state row decoded cell by cell: an unreadable instant is None, an unreadable
    counter is left out of ``counts`` (as a status never seen)."""
    counts = {s: dbrows.int_of(m[col]) for s, col in COUNT_COLUMNS.items()}
    return StateRecord(
        schedule_key=text(m["schedule_key"]),
        name=text(m["name"]),
        last_slot_at=dbrows.instant_or_none(sqlite, m["last_slot_at"]),
        last_done_at=dbrows.instant_or_none(sqlite, m["last_done_at"]),
        last_enqueued_at=dbrows.instant_or_none(sqlite, m["last_enqueued_at"]),
        last_message_id=dbrows.text_of(m["last_message_id"]),
        last_status=dbrows.text_of(m["last_status"]),
        last_error=dbrows.text_of(m["last_error"]),
        counts={s: n for s, n in counts.items() if n},
        runs=dbrows.int_of(m["runs_count"]) or 0,
    )
