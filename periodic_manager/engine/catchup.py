"""Misfire ``fire_once`` and ``all``: slots missed while no manager led, sent after the outage.

When a manager starts leading (at start or on a takeover), each ``fire_once`` or ``all``
schedule may have missed slots. ``fire_once`` sends the latest one within its catch-up window
once; ``all`` sends every one of them, oldest first across all schedules, paced at the
scheduler's ``catchup_rate`` slots a second (:func:`periodic_manager.pacing.paced`). Either way
only slots strictly after the schedule's ``effective_at`` (and within ``options.start_at`` /
``end_at``) and strictly after the latest one the runtime state records as settled are sent. On
a takeover, the slots after the instant its rebase resumes the entries at (``resumed``: ``now -
grace``, or later for a partition first held since) are left to the normal path (the scheduler
re-sends them).

A paced ``all`` catch-up stops when this manager stops leading; a slot of a schedule edited,
paused or deleted meanwhile is dropped, and one whose catch-up window has passed by its turn is
recorded skipped (``late``), since its task would reach the workers expired.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta

from periodic_manager.contracts import RunRecord, RuntimeStore, StateRecord
from periodic_manager.engine.entry import ScheduledEntry, lookback_floor
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.errors import cause
from periodic_manager.pacing import in_turns, paced
from periodic_manager.schedules import slots
from periodic_manager.schedules.bounds import bounds_of

log = logging.getLogger(__name__)

_TICK = timedelta(microseconds=1)


async def missed(
    entries: Sequence[ScheduledEntry],
    scheduler: Scheduler,
    now: datetime,
    *,
    resumed: datetime | None,
) -> list[tuple[ScheduledEntry, datetime]]:
    """The latest missed slot of every ``fire_once`` entry that has one (in turns with the other
    tasks: a takeover with a million entries must not hold up the first slots); ``resumed`` as
    for :func:`catch_up`."""
    out: list[tuple[ScheduledEntry, datetime]] = []
    async for part in in_turns(entries):
        for entry in part:
            found = _missed(entry, scheduler, now, resumed=resumed)
            if found is not None:
                out.append((entry, found))
    return out


def _missed(
    entry: ScheduledEntry, scheduler: Scheduler, now: datetime, *, resumed: datetime | None
) -> datetime | None:
    if entry.dead or entry.options.get("misfire") != "fire_once":
        return None
    earliest, top = _span(entry, scheduler, now)
    try:
        slot = slots.latest_slot(entry.schedule, top, earliest)
    except (OverflowError, ValueError) as exc:
        log.error("catch-up of %s skipped: %s", entry.config.name, cause(exc))
        return None
    if slot is None or (resumed is not None and slot > resumed):
        return None  # nothing missed, or the normal path sends it
    return slot


def _span(entry: ScheduledEntry, scheduler: Scheduler, now: datetime) -> tuple[datetime, datetime]:
    """``(earliest, top)``: a missed slot of ``entry`` is in ``(earliest, top]``."""
    # A slot exactly one window late still counts; one at effective_at does not.
    earliest = now - scheduler.window(entry) - _TICK
    floor = lookback_floor(entry.config, now)
    if floor is not None and floor > earliest:
        earliest = floor  # never a slot from before the schedule (or its timing) existed
    # Never a slot before options.start_at, nor one at or after options.end_at.
    return slots.span(earliest, now, bounds_of(entry.options))


async def catch_up(
    scheduler: Scheduler,
    store: RuntimeStore,
    now: datetime,
    *,
    resumed: datetime | None,
    still_leading: Callable[[], bool],
    entries: Sequence[ScheduledEntry] | None = None,
) -> None:
    """Send the latest missed slot of each ``fire_once`` entry once, then every missed slot of
    each ``all`` entry, paced (see the module doc); ``entries``: only these (a partition taken
    over), default every entry. ``resumed``: on a takeover, the instant its rebase resumed the
    entries after (their later slots are the normal path's); None at a start (every missed slot
    up to ``now`` is the catch-up's)."""
    if entries is None:
        entries = scheduler.entries()
    candidates = await missed(entries, scheduler, now, resumed=resumed)
    every: list[ScheduledEntry] = []
    async for part in in_turns(entries):
        every += [e for e in part if not e.dead and e.options.get("misfire") == "all"]
    if not candidates and not every:
        return
    try:
        state = await store.get_state([e.key for e, _ in candidates] + [e.key for e in every])
    except Exception as exc:
        # Without the state we cannot know what was sent beyond the claims' life: skip.
        log.error("catch-up skipped, runtime state unreadable: %s", cause(exc))
        return
    # Never a slot at or before the latest one the store records as settled (sent, found sent
    # or skipped for good): the broker's claims may be gone, the database's record is not.
    todo = [
        (e, s) for e, s in candidates if (done := _settled(state.get(e.key))) is None or done < s
    ]
    if todo and still_leading():
        await scheduler.catch_up(todo)
    if every:
        # On a takeover the slots after ``resumed`` are the normal path's (the rebase's).
        top = resumed if resumed is not None else now
        streams = [_every_missed(e, scheduler, now, top, _settled(state.get(e.key))) for e in every]
        await _send_paced(scheduler, heapq.merge(*streams), still_leading)


def _every_missed(
    entry: ScheduledEntry,
    scheduler: Scheduler,
    now: datetime,
    top: datetime,
    settled: datetime | None,
) -> Iterator[tuple[datetime, int, ScheduledEntry]]:
    """Every missed slot of a ``misfire: "all"`` entry, oldest first, as ``(slot, a number
    unique to the entry, entry)`` (the middle item keeps ``heapq.merge`` from comparing
    entries). Read lazily: a year of ``@every 1s`` is never a list."""
    earliest, last = _span(entry, scheduler, now)
    last = min(last, top)
    if settled is not None and settled > earliest:
        earliest = settled  # never a slot at or before the settled one
    order = id(entry)
    for slot in slots.walk(entry.schedule, earliest, bounds_of(entry.options)):
        if slot > last:
            break
        yield slot, order, entry


async def _send_paced(
    scheduler: Scheduler,
    slots: Iterator[tuple[datetime, int, ScheduledEntry]],
    still_leading: Callable[[], bool],
) -> None:
    expired: list[RunRecord] = []

    def sendable() -> Iterator[tuple[ScheduledEntry, datetime]]:
        # Judged as each batch is taken, at its instant: a dropped slot takes no turn.
        for slot, _, entry in slots:
            if entry.dead or scheduler.get(entry.ident) is not entry:
                continue  # edited, paused or deleted meanwhile: its new version decides
            now = scheduler.clock.now()
            if now - slot > scheduler.window(entry):
                expired.append(
                    RunRecord(
                        entry.key,
                        entry.name,
                        slot,
                        "skipped",
                        now,
                        error="catch-up: its catch-up window passed before its turn",
                        reason="late",
                    )
                )
                continue
            yield entry, slot

    sent = 0
    async for batch in paced(scheduler.clock, scheduler.catchup_rate, sendable()):
        if expired:
            scheduler.writer.report(expired)
            scheduler.dispatcher.counts["skipped"] += len(expired)
            expired = []
        if not still_leading():
            log.info("catch-up of missed slots stopped after %d: no longer leading", sent)
            return
        await scheduler.catch_up(batch)
        sent += len(batch)
    if expired:
        scheduler.writer.report(expired)
        scheduler.dispatcher.counts["skipped"] += len(expired)
    if sent:
        log.info("caught up %d missed slot(s) (misfire all)", sent)


def _settled(state: StateRecord | None) -> datetime | None:
    if state is None:
        return None
    marks = [at for at in (state.last_done_at, state.last_slot_at) if at is not None]
    return max(marks) if marks else None
