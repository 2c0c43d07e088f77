"""Every schedule's place in the "next slot first" order, kept up to date by what changed.

The order is a function of the rows (spec, zone, anchor, enabled, name) and of ``now``. Reading
and sorting all rows on every request costs tens of milliseconds at 10,000 rows, so each API
process keeps the sorted keys and brings them up to date the way the manager's sync does:

* rows: the change triggers give every write a fresh ``revision`` and leave a tombstone for
  every delete (README "Change detection"), so one look at the two largest revisions says whether
  anything changed, and only the rows and tombstones newer than the last one seen are read;
* time: when ``now`` passes a schedule's next slot that schedule moves; those are exactly the keys
  at the front of the order, so only they are computed again.

A TRUNCATE (tombstone id 0) or a clock that stepped back rebuilds everything.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right, insort
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from periodic_manager.db import rows as dbrows
from periodic_manager.db.models import DeletedJob, PeriodicJob
from periodic_manager.errors import ConfigError

NEVER = datetime.max.replace(tzinfo=UTC)
# (group, next slot, name, id): group 0 = enabled with a next slot, 1 = unusable, 2 = paused.
Key = tuple[int, datetime, str, int]
# Read raw and decoded here (periodic_manager.db.rows): a row written with SQL may hold anything,
# and one value the driver cannot convert would fail the whole read.
FIELDS = ("name", "spec", "timezone", "anchor", "enabled")
UNREADABLE = object()  # a spec or zone that cannot be read: the row sorts as unusable


def columns(session: AsyncSession) -> list[Any]:
    sqlite = _sqlite(session)
    return [PeriodicJob.id, *(dbrows.column(sqlite, n) for n in FIELDS)]


def _sqlite(session: AsyncSession) -> bool:
    return session.bind is not None and session.bind.dialect.name == "sqlite"


def _row(sqlite: bool, raw: Any) -> Row:
    values: list[Any] = []
    for name, value in zip(FIELDS, raw[1:], strict=True):
        try:
            values.append(dbrows.decode(sqlite, name, value))
        except ConfigError:
            values.append(UNREADABLE)
    name, spec, tz, anchor, enabled = values
    if UNREADABLE in (spec, tz, anchor, enabled):
        spec = tz = UNREADABLE  # no slot can be computed: group 1 (or 2 when paused)
        anchor = None
    return Row(
        name if isinstance(name, str) else "",
        spec,
        tz,
        anchor,
        enabled is not False,  # unreadable counts as not paused: it is shown as unusable
    )


@dataclass(slots=True)
class Row:
    name: str
    spec: Any
    timezone: Any
    anchor: datetime | None
    enabled: bool


class NextSlotOrder:
    """The sorted keys of every row; see the module docstring. One per app."""

    def __init__(self, slots: Any) -> None:
        self._slots = slots  # listing.NextSlots: next slot per (spec, zone, anchor)
        self._rows: dict[int, Row] = {}
        self._keys: dict[int, Key] = {}
        self._order: list[Key] = []
        self._watermark: int | None = None
        self._now: datetime | None = None
        self._lock = asyncio.Lock()

    async def snapshot(self, session: AsyncSession, now: datetime) -> list[Key]:
        """The order as of ``now`` (a copy: the caller may await while using it)."""
        async with self._lock:
            await self._catch_up(session, now)
            self._advance(now)
            return list(self._order)

    def _key(self, row_id: int, row: Row, now: datetime) -> Key:
        if not row.enabled:
            return (2, NEVER, row.name, row_id)
        slot = self._slots.get(row.spec, row.timezone, row.anchor, now)
        if isinstance(slot, str):
            return (1, NEVER, row.name, row_id)
        return (0, slot, row.name, row_id)

    async def _catch_up(self, session: AsyncSession, now: datetime) -> None:
        newest = (
            await session.execute(
                select(
                    select(func.max(PeriodicJob.revision)).scalar_subquery(),
                    select(func.max(DeletedJob.revision)).scalar_subquery(),
                )
            )
        ).one()
        mark = max(int(newest[0] or 0), int(newest[1] or 0))
        if self._watermark is None or (self._now is not None and now < self._now):
            await self._load_all(session, now, mark)
            return
        if mark <= self._watermark:
            return
        seen = self._watermark
        gone = (
            await session.execute(select(DeletedJob.id).where(DeletedJob.revision > seen))
        ).scalars()
        deleted = set(gone)
        if 0 in deleted:  # a TRUNCATE: everything must be read again
            await self._load_all(session, now, mark)
            return
        # Tombstones first, then the rows as they are now (an id may come back on SQLite).
        for row_id in deleted:
            self._drop(row_id)
        sqlite = _sqlite(session)
        stmt = select(*columns(session)).where(PeriodicJob.revision > seen)
        for raw in await session.execute(stmt):
            self._drop(raw[0])
            self._put(raw[0], _row(sqlite, raw), now)
        self._watermark = mark

    async def _load_all(self, session: AsyncSession, now: datetime, mark: int) -> None:
        sqlite = _sqlite(session)
        rows = await session.execute(select(*columns(session)))
        self._rows = {raw[0]: _row(sqlite, raw) for raw in rows}
        self._keys = {row_id: self._key(row_id, row, now) for row_id, row in self._rows.items()}
        self._order = sorted(self._keys.values())
        self._watermark = mark
        self._now = now

    def _drop(self, row_id: int) -> None:
        key = self._keys.pop(row_id, None)
        self._rows.pop(row_id, None)
        if key is not None:
            i = bisect_right(self._order, key) - 1
            if i >= 0 and self._order[i] == key:
                del self._order[i]

    def _put(self, row_id: int, row: Row, now: datetime) -> None:
        self._rows[row_id] = row
        key = self._key(row_id, row, now)
        self._keys[row_id] = key
        insort(self._order, key)

    def _advance(self, now: datetime) -> None:
        """Schedules whose next slot is no longer after ``now`` move on."""
        self._now = max(self._now or now, now)
        due = bisect_right(self._order, (0, now), key=lambda k: (k[0], k[1]))
        if not due:
            return
        moved = self._order[:due]
        del self._order[:due]
        for _, _, _, row_id in moved:
            key = self._key(row_id, self._rows[row_id], now)
            self._keys[row_id] = key
            insort(self._order, key)
