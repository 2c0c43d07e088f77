"""The slot rule, in one place: which slots of a schedule are sent, and when it has ended.

A schedule's slots are its cron or ``@every`` instants (its zone and anchor are in its parsed
:class:`~periodic_manager.cron.Schedule`), cut by its bounds (``options.start_at``: no slot
before it, a slot exactly at it counts; ``options.end_at``: none at or after it). A slot whose
local date, in the schedule's zone, is in a calendar ``options.exclude`` names is not sent (the
manager records it ``skipped``, reason ``excluded``); it uses no run. With ``options.max_runs``
no more than the runs left are sent, earliest first. ``options.jitter`` moves a slot's *send*
(:meth:`Rule.send_at`), never the slot. A schedule has ended when it has no slot left: past
``end_at``, out of runs, or no slot before year 10000.

Every surface asks this module, so what is previewed is what is sent: the engine
(``Entries.next_after``, the catch-up, the registration's runs left), the API's ``next_runs``
and ``/entries``, the dashboard's slots and listing, ``periodic-manager next``, and the backfill.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from periodic_manager import cron
from periodic_manager.schedules.bounds import NO_BOUNDS, Bounds, bounds_of
from periodic_manager.schedules.calendars import Exclusion, excluded_by
from periodic_manager.schedules.jitter import jitter_of, send_at

# datetime's resolution: "strictly after start - TICK" is ">= start".
TICK = timedelta(microseconds=1)
MAX_SCAN = 10_000  # slots a preview looks at in all (excluded ones count): bounded work
# What computing a slot may raise (no slot before year 10000, arithmetic at datetime's edge).
SLOT_ERRORS = (OverflowError, ValueError, ArithmeticError)

# How a slot strictly after an instant is found: ``schedule.next_after``, or a memo of it.
Finder = Callable[[cron.Schedule, datetime], datetime]


def _plain(schedule: cron.Schedule, after: datetime) -> datetime:
    return schedule.next_after(after)


def floor_of(after: datetime, bounds: Bounds) -> datetime:
    """The instant to search strictly after: ``after``, or just before ``start_at`` if later."""
    start = bounds.start_at
    if start is not None:
        floor = start - TICK
        if floor > after:
            return floor
    return after


def ended(slot: datetime, bounds: Bounds) -> bool:
    """Whether ``slot`` is at or after ``end_at`` (no such slot is ever sent)."""
    return bounds.end_at is not None and slot >= bounds.end_at


def next_slot(
    schedule: cron.Schedule, after: datetime, bounds: Bounds, find: Finder = _plain
) -> datetime | None:
    """The first slot strictly after ``after`` within ``bounds``, or None (ended). Raises what
    ``schedule.next_after`` raises (no slot before year 10000). ``find``: the engine's memo."""
    slot = find(schedule, floor_of(after, bounds))
    return None if ended(slot, bounds) else slot


def walk(schedule: cron.Schedule, after: datetime, bounds: Bounds) -> Iterator[datetime]:
    """Every slot strictly after ``after`` within ``bounds``, in order (lazily: a year of
    ``@every 1s`` is never a list), until the schedule ends or finds no slot before year 10000."""
    at = after
    while True:
        try:
            slot = next_slot(schedule, at, bounds)
        except SLOT_ERRORS:
            return
        if slot is None:
            return
        yield slot
        at = slot


def span(lo: datetime, hi: datetime, bounds: Bounds) -> tuple[datetime, datetime]:
    """The part of ``(lo, hi]`` within ``bounds``, as ``(lo, hi]`` again (possibly empty)."""
    lo = floor_of(lo, bounds)
    if bounds.end_at is not None and bounds.end_at <= hi:
        hi = bounds.end_at - TICK
    return lo, hi


def count_between(
    schedule: cron.Schedule, after: datetime | None, until: datetime, bounds: Bounds, cap: int
) -> int:
    """How many slots within ``bounds`` lie in ``(after, until]``, counting at most ``cap`` (a
    registration needs no more): the slots after the latest settled slot that the registering
    manager will not send (:mod:`periodic_manager.schedules.runs`). ``after`` None: none
    (nothing was ever settled, nothing counted)."""
    if after is None or until <= after or cap <= 0:
        return 0
    found = 0
    for slot in walk(schedule, after, bounds):
        if slot > until or found >= cap:
            break
        found += 1
    return found


def latest_slot(schedule: cron.Schedule, now: datetime, earliest: datetime) -> datetime | None:
    """The latest slot of ``schedule`` in ``(earliest, now]``, if any (raises what
    ``schedule.next_after`` raises).

    Searches back from ``now`` in doubling spans, so the cost follows the gap before the latest
    slot, not the number of slots in the window: walking every slot of an hour of ``@every 1s``
    for each of a hundred schedules held the event loop (and with it the leadership checks) for
    seconds.
    """
    gap = timedelta(seconds=1)
    while True:
        start = max(earliest, now - gap)
        slot = schedule.next_after(start)
        if slot <= now:
            found = slot
            while (slot := schedule.next_after(slot)) <= now:
                found = slot
            return found
        if start == earliest:
            return None
        gap *= 2


class Slot(NamedTuple):
    """A slot (UTC) and the calendar of ``options.exclude`` that keeps it from being sent."""

    at: datetime
    excluded: str | None


class Ruled(Protocol):
    """What the rule needs of a schedule (a config or an entry)."""

    @property
    def schedule(self) -> cron.Schedule: ...
    @property
    def options(self) -> Mapping[str, Any] | None: ...
    @property
    def exclusion(self) -> Exclusion | None: ...
    @property
    def timezone(self) -> str: ...
    @property
    def name(self) -> str: ...


def excluded(config: Ruled, slot: datetime) -> str | None:
    """The calendar of ``config``'s ``options.exclude`` that keeps ``slot`` from being sent
    (its local date in the schedule's zone), or None."""
    return excluded_by(config.exclusion, slot, config.timezone)


class Rule(NamedTuple):
    """A schedule's slot rule: its parsed schedule, bounds, exclusion (its zone's dates) and
    jitter. Built from a config by :meth:`of`, or from its parts by a preview that has no config
    (``periodic-manager next``, the dashboard's slots)."""

    schedule: cron.Schedule
    bounds: Bounds = NO_BOUNDS
    exclusion: Exclusion | None = None
    zone: str = "UTC"
    jitter_us: int = 0
    name: str = ""

    @classmethod
    def of(cls, config: Ruled) -> Rule:
        """The rule of a checked config (raises what parsing its schedule raises)."""
        opts = config.options
        return cls(
            config.schedule,
            bounds_of(opts),
            config.exclusion,
            config.timezone,
            jitter_of(opts),
            config.name,
        )

    def excluded(self, slot: datetime) -> str | None:
        """The calendar that keeps ``slot`` from being sent, or None."""
        return excluded_by(self.exclusion, slot, self.zone)

    def next_slot(self, after: datetime) -> datetime | None:
        """The first slot strictly after ``after`` within the bounds (excluded or not), or None
        once the schedule has ended (also when no slot is left before year 10000)."""
        try:
            return next_slot(self.schedule, after, self.bounds)
        except SLOT_ERRORS:
            return None

    def next_sent(self, after: datetime, left: int | None = None) -> datetime | None:
        """The first slot strictly after ``after`` that is sent (``left``: runs left of
        ``options.max_runs``, None: no limit), or None."""
        found = self.upcoming(after, 1, left=left)
        return found[0].at if found else None

    def has_ended(self, now: datetime, left: int | None = None) -> bool:
        """Whether no slot after ``now`` is left: past ``end_at``, no run left, or none before
        year 10000 (a slot on an excluded date is still a slot: the schedule goes on)."""
        return (left is not None and left <= 0) or self.next_slot(now) is None

    def send_at(self, slot: datetime) -> datetime:
        """When ``slot`` is sent: itself, or later by its ``options.jitter`` offset."""
        return send_at(self.name, slot, self.jitter_us) if self.jitter_us else slot

    def upcoming(
        self, after: datetime, n: int, *, left: int | None = None, show_excluded: bool = False
    ) -> list[Slot]:
        """The first ``n`` slots strictly after ``after`` (UTC) that are sent, at most ``left``
        of them (runs left of ``options.max_runs``; None: no limit). ``show_excluded``: slots on
        an excluded date are listed too (marked, using no run; up to the last run). Fewer when
        the schedule ends, or after :data:`MAX_SCAN` slots looked at (a schedule whose every
        slot is excluded never spins). The one preview of every surface."""
        out: list[Slot] = []
        found = walk(self.schedule, after, self.bounds)
        for _ in range(MAX_SCAN):
            at = next(found, None) if len(out) < n else None
            if at is None:
                break
            calendar = self.excluded(at)
            if calendar is None:
                if left is not None:
                    if left <= 0:
                        break
                    left -= 1
            elif not show_excluded:
                continue
            out.append(Slot(at.astimezone(cron.UTC), calendar))
        return out

    def between(self, start: datetime, end: datetime, most: int) -> tuple[list[datetime], int]:
        """The slots in ``[start, end)`` that are sent (UTC, in order) and how many are excluded;
        OverflowError when there are more than ``most`` (excluded ones count)."""
        out: list[datetime] = []
        excluded = 0
        for at in walk(self.schedule, start - TICK, self.bounds):
            if at >= end:
                break
            if len(out) + excluded == most:
                raise OverflowError(most)
            if self.excluded(at) is not None:
                excluded += 1
            else:
                out.append(at.astimezone(cron.UTC))
        return out, excluded
