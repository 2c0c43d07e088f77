"""Upcoming slots with the daylight-saving changes that touch them marked, for the dashboard.

The slots come from the slot rule (:mod:`periodic_manager.schedules.slots`, as the engine and
every other preview); this module only explains them. A slot is marked:

* ``offset-change``: its UTC offset differs from the previous slot's (for the first slot: from
  the offset at the instant the list starts from), so the wall-clock distance to it is not the
  real one;
* ``shifted``: a fixed-hour cron schedule (hour field not starting with ``*``) whose nominal local
  time did not exist (spring-forward gap) and which the engine fires shifted by the gap size
  (02:30 -> 03:30, docs/cron.md §8); the nominal time is given;
* ``repeated-hour``: its local time occurs twice (fall-back fold); ``first pass`` or
  ``second pass`` says which (fixed-hour schedules fire in the first pass only, wildcard-hour ones
  in both);
* ``excluded``: its local date is in a calendar ``options.exclude`` names: it is not sent (the
  manager records it ``skipped``); the note names the calendar.

Only ``zoneinfo`` and the parsed expression are used, never the engine's internals, so the marks
are an independent reading of the engine's answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from periodic_manager import cron
from periodic_manager.cron.parser import CronSpec, parse_spec
from periodic_manager.schedules.bounds import NO_BOUNDS, Bounds
from periodic_manager.schedules.calendars import Exclusion, skip_reason
from periodic_manager.schedules.slots import Rule

# The largest offset change of any zone's transition is under a day (Apia 2011: 24 h).
MAX_GAP = timedelta(days=1)
SECOND = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class MarkedSlot:
    at: datetime  # UTC
    local: datetime  # the same instant in the schedule's zone (fold set for a second pass)
    marks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def offset_text(offset: timedelta | None) -> str:
    seconds = int((offset or timedelta(0)).total_seconds())
    sign = "-" if seconds < 0 else "+"
    hours, rest = divmod(abs(seconds), 3600)
    return f"{sign}{hours:02d}:{rest // 60:02d}"


def marked_slots(
    spec: str,
    timezone: str,
    anchor: datetime | None,
    after: datetime,
    n: int,
    bounds: Bounds = NO_BOUNDS,
    exclusion: Exclusion | None = None,
    left: int | None = None,
) -> list[MarkedSlot]:
    """The first ``n`` slots strictly after ``after`` within ``bounds`` (options.start_at and
    options.end_at), those on a date ``exclusion`` holds included (marked, using no run), at
    most ``left`` sent ones (options.max_runs), marked: :meth:`Rule.upcoming`, as the engine and
    every other preview. Raises CronError (a ValueError) for an invalid spec or zone; stops
    early where the schedule ends or the engine finds no more slots."""
    schedule = cron.parse(spec, tz=timezone, anchor=anchor)
    parsed = parse_spec(spec)
    fixed = parsed if isinstance(parsed, CronSpec) and parsed.fixed_hour else None
    zone = ZoneInfo(timezone)
    previous = after.astimezone(zone).utcoffset()
    out: list[MarkedSlot] = []
    rule = Rule(schedule, bounds, exclusion, timezone)
    for at, calendar in rule.upcoming(after, n, left=left, show_excluded=True):
        slot = _mark(at, zone, previous, fixed)
        if calendar is not None:
            slot.marks.append("excluded")
            slot.notes.append(f"not sent: {skip_reason(at, timezone, calendar)}")
        previous = slot.local.utcoffset()
        out.append(slot)
    return out


def _mark(
    at: datetime, zone: ZoneInfo, previous: timedelta | None, fixed: CronSpec | None
) -> MarkedSlot:
    local = at.astimezone(zone)
    offset = local.utcoffset()
    slot = MarkedSlot(at=at, local=local)
    if offset != previous:
        slot.marks.append("offset-change")
        slot.notes.append(f"UTC offset {offset_text(previous)} -> {offset_text(offset)}")
    if fixed is not None:
        nominal = _shifted_from(at, zone)
        if nominal is not None and _matches(fixed, nominal):
            slot.marks.append("shifted")
            slot.notes.append(
                f"{nominal:%H:%M} did not exist (clocks sprang forward): fired at {local:%H:%M}"
            )
    twin = local.replace(fold=1 - local.fold)
    if twin.utcoffset() != offset:
        which = "second" if local.fold else "first"
        slot.marks.append("repeated-hour")
        slot.notes.append(f"{local:%H:%M} happens twice (clocks fell back): {which} pass")
    return slot


def _shifted_from(at: datetime, zone: ZoneInfo) -> datetime | None:
    """The nonexistent wall time a gap shift would have moved to ``at``, or None.

    A spring-forward transition at ``T`` from offset ``old`` to ``new`` (gap ``G = new - old``)
    skips the wall times ``[T + old, T + new)``; a fixed-hour slot nominally there fires at the
    instant showing it with the old offset, which lies in ``[T, T + G)``. So ``at`` may be a
    shifted slot iff the last transition before it is such a gap and ``at - T < G``.
    """
    new = at.astimezone(zone).utcoffset()
    old = (at - MAX_GAP).astimezone(zone).utcoffset()
    if new is None or old is None or new <= old:
        return None
    lo, hi = at - MAX_GAP, at  # offset(lo) == old, offset(hi) == new: bisect to the transition
    while hi - lo > SECOND:
        mid = lo + (hi - lo) / 2
        if mid.astimezone(zone).utcoffset() == new:
            hi = mid
        else:
            lo = mid
    transition = hi.replace(microsecond=0)  # transitions are whole seconds: hi is in [T, T+1 s)
    if at - transition >= new - old:
        return None
    return (at + old).replace(tzinfo=None)


def _matches(spec: CronSpec, t: datetime) -> bool:
    """Does the naive wall time ``t`` match the expression (cron-semantics day rule)?"""
    if t.minute not in spec.minutes or t.hour not in spec.hours or t.month not in spec.months:
        return False
    dom = t.day in spec.doms
    dow = t.isoweekday() % 7 in spec.dows
    return (dom and dow) if spec.day_and else (dom or dow)
