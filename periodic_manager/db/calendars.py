"""The one reader and writer of ``pm_calendars``: exclusion calendars by name.

Rows are untrusted (plain SQL may write them): :func:`read_all` reads every calendar's text and
judges it with :func:`periodic_manager.schedules.calendars.parse_stored`; a calendar that cannot
be read is left out of :func:`specs` (so a schedule naming it is a row error, as for a missing
one) and shown with its error by :func:`read_all`. Writes renew the revision of every schedule
that names the calendar (triggers of migration 0016), so managers re-read exactly those.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from periodic_manager.db.models import calendars_table, jobs_table
from periodic_manager.errors import ConfigError
from periodic_manager.schedules.calendars import CalendarSpec, parse_stored

C = calendars_table.c
J = jobs_table.c
MAX_CALENDARS = (
    10_000  # read at most this many (a manager reads them at every sync that reads rows)
)


@dataclass(frozen=True, slots=True)
class StoredCalendar:
    """A calendar as stored: its checked content, or the error that makes it unusable."""

    name: str
    spec: CalendarSpec | None
    error: ConfigError | None
    updated_at: datetime | None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _judge(name: Any, text: Any, updated_at: Any) -> StoredCalendar:
    shown = _text(name)
    stamp = updated_at if isinstance(updated_at, datetime) else None
    try:
        return StoredCalendar(shown, parse_stored(text), None, stamp)
    except ConfigError as exc:
        return StoredCalendar(shown, None, exc, stamp)


async def read_all(conn: AsyncConnection) -> list[StoredCalendar]:
    """Every calendar by name (at most MAX_CALENDARS), each judged."""
    rows = await conn.execute(
        select(C.name, C.spec, C.updated_at).order_by(C.name).limit(MAX_CALENDARS)
    )
    return [_judge(*row) for row in rows]


async def read_one(conn: AsyncConnection, name: str) -> StoredCalendar | None:
    row = (await conn.execute(select(C.name, C.spec, C.updated_at).where(C.name == name))).first()
    return None if row is None else _judge(*row)


async def specs(conn: AsyncConnection) -> dict[str, CalendarSpec]:
    """The usable calendars by name: what ``options.exclude`` is resolved against."""
    return {c.name: c.spec for c in await read_all(conn) if c.spec is not None}


async def put(conn: AsyncConnection, name: str, spec: CalendarSpec, now: datetime) -> bool:
    """Write calendar ``name`` (checked name and content) and commit; True when it was created."""
    done = await conn.execute(
        update(calendars_table).where(C.name == name).values(spec=spec.text, updated_at=now)
    )
    created = not done.rowcount
    if created:
        try:
            await conn.execute(
                insert(calendars_table).values(name=name, spec=spec.text, updated_at=now)
            )
        except IntegrityError:  # created meanwhile by another writer: this write replaces it
            await conn.rollback()
            await conn.execute(
                update(calendars_table).where(C.name == name).values(spec=spec.text, updated_at=now)
            )
            created = False
    await conn.commit()
    return created


async def users(conn: AsyncConnection, name: str) -> list[str]:
    """Names of the schedules whose ``options.exclude`` names calendar ``name`` (rows are
    untrusted: options that cannot be read name nothing)."""
    text = J.options.cast(calendars_table.c.spec.type)
    rows = await conn.execute(
        select(J.name, text).where(
            text.contains('"exclude"', autoescape=True), text.contains(f'"{name}"', autoescape=True)
        )
    )
    found = []
    for row_name, options in rows:
        try:
            value = json.loads(options)
        except (TypeError, ValueError, RecursionError):
            continue
        names = value.get("exclude") if isinstance(value, dict) else None
        if isinstance(names, list) and name in names:
            found.append(_text(row_name))
    return sorted(found)


async def remove(conn: AsyncConnection, name: str) -> list[str] | None:
    """Delete calendar ``name`` unless a schedule names it, and commit. None when it was deleted
    (or there was none); else the names of the schedules that name it (nothing is deleted: a
    schedule that names a missing calendar is a row error)."""
    found = await users(conn, name)
    if found:
        await conn.rollback()
        return found
    await conn.execute(delete(calendars_table).where(C.name == name))
    await conn.commit()
    return None
