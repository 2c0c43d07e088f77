"""Every schedule's place in the "next slot first" order, kept up to date by what changed.

The order is a function of the rows (spec, zone, anchor, enabled, name) and of ``now``. Reading
and sorting all rows on every request costs tens of milliseconds at 10,000 rows, so each API
process keeps the sorted keys and brings them up to date the way the manager's sync does:

* rows: the change triggers give every write a fresh ``revision`` and leave a tombstone for
  every delete, so one look at the two largest revisions says whether anything changed, and only
  the rows and tombstones newer than the last one seen are read: the change feed the manager's
  provider follows too (``periodic_manager.db.changes``);
* time: when ``now`` passes a schedule's next slot that schedule moves; those are exactly the keys
  at the front of the order, so only they are computed again.

A TRUNCATE (tombstone id 0) reads everything again; a clock that stepped back computes every
key again from the rows kept (it reads nothing).

Only what the order needs is kept of a row (its name, group and timing). A full read judges the
rows partition by partition (``changes.stream_rows``), so the payloads of all rows, which the
judge must see, are never held at once.

Whether a row is usable is decided by the manager's own judge (``periodic_manager.db.judge``), over
every column it reads: a row with a good spec but a bad task type, payload or options has no next
slot here either, and sorts with the unusable rows, as its error badge says.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right, insort
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from periodic_manager.contracts import RowError
from periodic_manager.db import changes
from periodic_manager.db import judge as dbjudge
from periodic_manager.db import rows as dbrows
from periodic_manager.db.engine import Connection
from periodic_manager.errors import ConfigError
from periodic_manager.schedules.bounds import NO_BOUNDS, Bounds, bounds_of
from periodic_manager.schedules.definition import PeriodicTaskConfig

from .listing import NextSlots

NEVER = datetime.max.replace(tzinfo=UTC)
# (group, next slot, name, id): group 0 = enabled with a next slot, 1 = unusable, 2 = paused.
Key = tuple[int, datetime, str, int]
ENABLED, UNUSABLE, PAUSED = 0, 1, 2


def _row(judge: dbjudge.RowJudge, raw: Any) -> Row:
    """The row's group, as the manager's judge sees it: paused (``enabled`` false), unusable
    (any row error, a bad ``enabled`` included), or enabled with the timing of its slots.
    Rows are read raw (``dbrows.columns``): a row written with SQL may hold anything, and one
    value the driver cannot convert would fail the whole read."""
    verdict = judge(raw)
    if isinstance(verdict, PeriodicTaskConfig):
        return Row(
            verdict.name,
            ENABLED,
            verdict.spec,
            verdict.timezone,
            verdict.anchor,
            bounds_of(verdict.options),
        )
    if isinstance(verdict, RowError):
        return Row(verdict.name or "", UNUSABLE)
    try:  # paused: only its name is needed, for the order among paused rows
        name = dbrows.decode(judge.rules.sqlite, "name", raw[2])
    except ConfigError:
        name = None
    return Row(name if isinstance(name, str) else "", PAUSED)


@dataclass(slots=True)
class Row:
    name: str
    group: int
    spec: str | None = None
    timezone: str | None = None
    anchor: datetime | None = None
    bounds: Bounds = NO_BOUNDS


class NextSlotOrder:
    """The sorted keys of every row; see the module docstring. One per app."""

    def __init__(self, slots: NextSlots) -> None:
        self._slots = slots  # next slot per (spec, zone, anchor)
        self._rows: dict[int, Row] = {}
        self._keys: dict[int, Key] = {}
        self._order: list[Key] = []
        self._watermark: int | None = None
        self._now: datetime | None = None
        self._lock = asyncio.Lock()

    async def snapshot(self, conn: Connection, now: datetime, rules: dbjudge.Rules) -> list[Key]:
        """The order as of ``now`` (a copy: the caller may await while using it); rows are
        judged by ``rules``, as the manager and the list's error badges judge them."""
        async with self._lock:
            await self._catch_up(conn, now, dbjudge.RowJudge(rules))
            self._advance(now)
            return list(self._order)

    def _key(self, row_id: int, row: Row, now: datetime) -> Key:
        if row.group != ENABLED:
            return (row.group, NEVER, row.name, row_id)
        slot = self._slots.get(row.spec, row.timezone, row.anchor, now, row.bounds)
        if isinstance(slot, str):  # no next slot (past year 9999): unusable, as the list says
            return (UNUSABLE, NEVER, row.name, row_id)
        if slot is None:  # past options.end_at: after the unusable rows, with the paused ones
            return (PAUSED, NEVER, row.name, row_id)
        return (ENABLED, slot, row.name, row_id)

    async def _catch_up(self, conn: Connection, now: datetime, judge: dbjudge.RowJudge) -> None:
        if self._watermark is None:
            await self._load_all(conn, now, await changes.current_revision(conn), judge)
            return
        if self._now is not None and now < self._now:
            # The clock stepped back: the rows are as they were, only their next slots move.
            self._keys = {i: self._key(i, row, now) for i, row in self._rows.items()}
            self._order = sorted(self._keys.values())
            self._now = now
        seen = self._watermark
        found = await changes.changes_since(conn, seen)
        if found is None:
            return
        if found.full:  # a TRUNCATE: everything must be read again
            await self._load_all(conn, now, found.revision, judge)
            return
        # Tombstones first, then the rows as they are now (an id may come back on SQLite).
        for row_id in set(found.deleted):
            self._drop(row_id)
        for raw in await changes.read_rows(conn, since=seen):
            self._drop(raw[0])
            self._put(raw[0], _row(judge, raw), now)
        self._watermark = found.revision

    async def _load_all(
        self, conn: Connection, now: datetime, mark: int, judge: dbjudge.RowJudge
    ) -> None:
        self._rows = {}
        async for part in changes.stream_rows(conn):
            for raw in part:
                self._rows[raw[0]] = _row(judge, raw)
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
