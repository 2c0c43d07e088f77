"""Misfire ``fire_once``: the latest slot missed while no manager led, sent once.

When a manager starts leading (at start or on a takeover), each ``fire_once`` schedule may have
missed slots. The latest one within its catch-up window, and strictly after its
``effective_at``, is sent once, unless the recorded runtime state shows it was sent. On a
takeover, slots within grace are left to the normal path (the scheduler re-sends them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from periodic_manager.contracts import RuntimeStore, StateRecord
from periodic_manager.engine.entry import ScheduledEntry, lookback_floor
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.pacing import in_turns
from periodic_manager.schedules.bounds import bounds_of, floor_of

log = logging.getLogger(__name__)

_TICK = timedelta(microseconds=1)


async def missed(
    entries: Sequence[ScheduledEntry], scheduler: Scheduler, now: datetime, *, takeover: bool
) -> list[tuple[ScheduledEntry, datetime]]:
    """The latest missed slot of every ``fire_once`` entry that has one (in turns with the other
    tasks: a takeover with a million entries must not hold up the first slots)."""
    out: list[tuple[ScheduledEntry, datetime]] = []
    async for part in in_turns(entries):
        for entry in part:
            found = _missed(entry, scheduler, now, takeover=takeover)
            if found is not None:
                out.append((entry, found))
    return out


def _missed(
    entry: ScheduledEntry, scheduler: Scheduler, now: datetime, *, takeover: bool
) -> datetime | None:
    if entry.dead or entry.options.get("misfire") != "fire_once":
        return None
    # A slot exactly one window late still counts; one at effective_at does not.
    earliest = now - scheduler.window(entry) - _TICK
    floor = lookback_floor(entry.config, now)
    if floor is not None and floor > earliest:
        earliest = floor  # never a slot from before the schedule (or its timing) existed
    bounds = bounds_of(entry.options)
    earliest = floor_of(earliest, bounds)  # never a slot before options.start_at
    top = now  # nor one at or after options.end_at
    if bounds.end_at is not None and bounds.end_at <= now:
        top = bounds.end_at - _TICK
    try:
        slot = latest_slot(entry, top, earliest)
    except (OverflowError, ValueError) as exc:
        log.error("catch-up of %s skipped: %s", entry.config.name, exc)
        return None
    if slot is None or (takeover and slot > now - scheduler.grace):
        return None  # nothing missed, or the normal path sends it
    return slot


async def catch_up(
    scheduler: Scheduler, store: RuntimeStore, now: datetime, *, takeover: bool,
    still_leading: Callable[[], bool], entries: Sequence[ScheduledEntry] | None = None,
) -> None:
    """Send the latest missed slot of each ``fire_once`` entry once (see the module doc);
    ``entries``: only these (a partition taken over), default every entry."""
    if entries is None:
        entries = scheduler.entries()
    candidates = await missed(entries, scheduler, now, takeover=takeover)
    if not candidates:
        return
    try:
        state = await store.get_state([e.key for e, _ in candidates])
    except Exception as exc:
        # Without the state we cannot know what was sent beyond the claims' life: skip.
        log.error("catch-up skipped, runtime state unreadable: %s", exc)
        return
    # Never a slot at or before the latest one the store records as settled (sent, found sent
    # or skipped for good): the broker's claims may be gone, the database's record is not.
    todo = [(e, s) for e, s in candidates if (done := _settled(state.get(e.key))) is None or done < s]
    if todo and still_leading():
        await scheduler.catch_up(todo)


def _settled(state: StateRecord | None) -> datetime | None:
    if state is None:
        return None
    marks = [at for at in (state.last_done_at, state.last_slot_at) if at is not None]
    return max(marks) if marks else None


def latest_slot(entry: ScheduledEntry, now: datetime, earliest: datetime) -> datetime | None:
    """The latest slot of ``entry`` in ``(earliest, now]``, if any.

    Searches back from ``now`` in doubling spans, so the cost follows the gap before the latest
    slot, not the number of slots in the window: walking every slot of an hour of ``@every 1s``
    for each of a hundred schedules held the event loop (and with it the leadership checks) for
    seconds.
    """
    span = timedelta(seconds=1)
    while True:
        start = max(earliest, now - span)
        slot = entry.schedule.next_after(start)
        if slot <= now:
            found = slot
            while (slot := entry.schedule.next_after(slot)) <= now:
                found = slot
            return found
        if start == earliest:
            return None
        span *= 2
