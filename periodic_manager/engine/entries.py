"""The registered schedules: one entry per schedule key, each filed on the timetable at its next
slot.

What decides an entry's next slot lives here: a new schedule's first slot is strictly after it
was registered (and after the last slot this process handled for its key); a replacement with the
same timing and name keeps its pending slot, and one that changes them still carries a slot of
the old version that was already due (an edit never drops a slot); a takeover restarts every
entry after what was settled (:meth:`Entries.rebase`); an entry whose next slot cannot be computed
(past year 9999) stops alone, with its error.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from periodic_manager.contracts import Clock
from periodic_manager.cron import Schedule
from periodic_manager.engine.entry import ScheduledEntry, lookback_floor, same_slots
from periodic_manager.engine.timetable import SendTable, Timetable
from periodic_manager.pacing import in_turns
from periodic_manager.schedules import slots
from periodic_manager.schedules.bounds import NO_BOUNDS, bounds_of
from periodic_manager.schedules.definition import PeriodicTaskConfig, ident_of
from periodic_manager.schedules.jitter import jitter_of, send_at
from periodic_manager.schedules.runs import max_runs_of, runs_left

log = logging.getLogger(__name__)

MEMO_MAX = 100_000  # distinct schedules whose next slot is remembered (see next_after)
Ident = int | str
# options.max_runs: what the store records of a schedule, (runs counted, latest settled slot).
Counted = tuple[int, datetime | None]


@dataclass(slots=True)
class _LookBack:
    """A takeover under way: the entries of the schedules it takes (``keep``; None: every one)
    that are registered meanwhile are filed at their resumed slot (see :meth:`Entries.rebase`
    and :meth:`Entries.resuming`). ``at``: the instant the look back is judged at (None: each
    registration's own ``now``); ``rebased``: the idents so filed with their runs left read."""

    after: datetime
    settled: Mapping[Ident, datetime]
    at: datetime | None
    keep: Callable[[Ident], bool] | None
    rebased: set[Ident] = field(default_factory=set)

    def covers(self, ident: Ident) -> bool:
        return self.keep is None or self.keep(ident)


class Entries:
    """The registered entries by ident (``config.ident``), and the timetable of their next slots.

    ``changed()`` is called after every registration, removal or rebase (the scheduler wakes up
    and checks a batch staged before it); :attr:`changes` counts them.
    """

    def __init__(self, clock: Clock, changed: Callable[[], None]) -> None:
        self.clock = clock
        self.timetable = Timetable()
        # Entries with options.jitter, by send instant (slot + offset); the others never go there.
        self.sends = SendTable()
        self.changes = 0
        self._changed = changed
        self._entries: dict[Ident, ScheduledEntry] = {}
        # The latest slot handled for schedules no longer registered (a pause, a delete): a
        # schedule that comes back soon never resends it. Entries keep their own (``fired``).
        self._retired: dict[Ident, datetime] = {}
        self._memo: dict[Schedule, tuple[datetime, datetime | str]] = {}  # see next_after
        # The idents of the entries with options.max_runs (the scheduler reads their count
        # again before it sends them: engine/decisions.py).
        self.limited: set[Ident] = set()
        # While a takeover rebases in turns (rebase) or registers what it took (resuming): the
        # look back an entry registered meanwhile is filed with.
        self._back: _LookBack | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Ident) -> ScheduledEntry | None:
        """The entry of schedule ``key`` (a key string, or an ident)."""
        return self._entries.get(ident_of(key) if isinstance(key, str) else key)

    def held(self) -> dict[Ident, ScheduledEntry]:
        """The entries by ident (this object's own map: read it, do not change it)."""
        return self._entries

    def register(
        self,
        config: PeriodicTaskConfig,
        *,
        synced: bool,
        now: datetime,
        counted: Counted | None = None,
        start: datetime | None = None,
    ) -> tuple[ScheduledEntry, ScheduledEntry | None]:
        """File the entry of ``config``; returns it and the entry it replaced (if any).

        ``counted``: for a schedule with ``options.max_runs``, what the store records of it
        (needed unless it replaces a limited entry, whose runs left carry over). ``start``: for
        a schedule new to this manager, the instant its slots start after when that is before
        ``now`` (a schedule created after the previous sync: the slots since its creation,
        within grace, were previewed and are sent); default ``now``."""
        ident = config.ident
        old = self._entries.get(ident)
        last = old.fired if old is not None else self._retired.pop(ident, None)
        begin = now if start is None or old is not None or start > now else start
        entry = ScheduledEntry.of(
            config, now, prev_slot=last, after=begin, fired=last, synced=synced
        )
        limit = max_runs_of(config.options)
        back = self._back if self._back is not None and self._back.covers(ident) else None
        (self.limited.discard if limit is None else self.limited.add)(ident)
        # Under a look back with its count, the runs left are the rebase's (read afresh).
        if limit is not None and (back is None or counted is None):
            if old is not None and old.runs_left is not None:
                # Same schedule, same count: an edit of max_runs moves the end by the difference.
                entry.runs_left = max(0, old.runs_left + limit - (max_runs_of(old.options) or 0))
            else:
                entry.runs_left = self._runs_left(
                    entry, limit, counted, max(begin, last) if last else begin
                )
        if back is not None:
            # A takeover under way: filed at its resumed slot, as the rebase files every entry
            # it takes (one slot computed, one filing). One path: :meth:`_rebase`.
            if old is not None:
                if same_slots(old, config):
                    entry.prev_slot, entry.last_error = old.prev_slot, old.last_error
                old.kill()
            self._entries[ident] = entry
            at = now if back.at is None else back.at
            self._rebase(
                entry, back.after, back.settled.get(ident), at, counted, fresh=counted is not None
            )
            if counted is not None or limit is None:
                back.rebased.add(ident)
            self._change()
            return entry, old
        self._time(entry, old, now, begin, last)
        if old is not None:
            old.kill()
        self._entries[ident] = entry
        if entry.next_slot is not None:
            self._file(entry, entry.next_slot)
        self._change()
        return entry, old

    def _time(
        self,
        entry: ScheduledEntry,
        old: ScheduledEntry | None,
        now: datetime,
        begin: datetime,
        last: datetime | None,
    ) -> None:
        """Set the next slot of ``entry``, registered at ``now`` (not under a look back):
        ``old``'s pending slot when the timing is the same, else its first slot after ``begin``
        (and after ``last``, the latest one handled), or a slot of ``old`` already due."""
        if old is not None and same_slots(old, entry):
            entry.next_slot, entry.after = old.next_slot, old.after
            entry.prev_slot, entry.last_error = old.prev_slot, old.last_error
            if entry.runs_left is not None:
                if entry.runs_left <= 0:
                    entry.next_slot = None  # max_runs lowered to what was sent: it ends now
                elif old.next_slot is None and old.runs_left is not None and old.runs_left <= 0:
                    # It had ended by max_runs, now raised: it goes on after what it sent.
                    entry.next_slot = self.next_after(entry, max(now, last) if last else now)
            return
        entry.next_slot = self.next_after(entry, max(begin, last) if last is not None else begin)
        pending = old.next_slot if old is not None else None
        if (
            pending is not None
            and pending <= now
            and (last is None or pending > last)
            and _within(pending, entry)
        ):
            entry.next_slot = pending  # due under the old version: carried, not dropped

    def unregister(self, key: Ident) -> ScheduledEntry | None:
        """Remove the entry of schedule ``key`` (the timetable forgets it lazily); it, or None."""
        ident = ident_of(key) if isinstance(key, str) else key
        entry = self._entries.pop(ident, None)
        self.limited.discard(ident)
        if entry is not None:
            entry.kill()
            if entry.fired is not None:
                self._retired[ident] = entry.fired
            self._change()
        return entry

    async def compact(self) -> int:
        """Give up what unregistered entries still hold, after many went at once (a manager
        handing partitions over): their stale filings on the timetables (see
        :meth:`Timetable.compact`), and the room of the map of entries by ident, which never
        shrinks as keys are deleted (rebuilt in place: the same map, sized for what is left).
        How many filings were forgotten."""
        dropped = await self.timetable.compact() + await self.sends.compact()
        entries = self._entries
        left = dict(entries)  # one pass in C: ~10 ms for 250,000
        entries.clear()  # frees the table sized for the entries that went
        entries.update(left)
        return dropped

    def _runs_left(
        self, entry: ScheduledEntry, limit: int, counted: Counted | None, start: datetime
    ) -> int:
        """Runs left of a limited entry that sends slots after ``start``: ``limit`` minus the
        runs the store counts, minus one when a slot lies after its settled slot (and after
        ``effective_at``) up to ``start``: this manager will not send it, and a manager that
        died may have sent it without recording it (schedules/runs.py)."""
        runs, settled = counted if counted is not None else (0, None)
        left = runs_left(limit, runs)
        floor = lookback_floor(entry, start)  # nothing before effective_at was sent
        if floor is not None and (settled is None or floor > settled):
            settled = floor
        bounds = bounds_of(entry.options)
        try:
            schedule = entry.schedule
        except Exception:  # noqa: BLE001 - a spec that does not parse fails later, with its error
            return left
        # A limited schedule sends a slot only once its previous run is recorded (engine/
        # decisions.py): at most one sent run is unrecorded, if any slot lies in between.
        return left - slots.count_between(schedule, settled, start, bounds, min(left, 1))

    def forget_retired(self, before: datetime) -> None:
        """Forget what was sent for schedules unregistered long ago (their last slot before
        ``before``): the map stays as small as the recent pauses and deletes."""
        self._retired = {k: v for k, v in self._retired.items() if v >= before}

    def next_after(self, entry: ScheduledEntry, after: datetime) -> datetime | None:
        """The entry's first slot strictly after ``after`` (and after ``entry.after``), or None
        when there is none before year 10000: that entry stops, the others go on.

        Memoised per schedule (shared by every row with the same spec, zone and anchor): a slot
        found after ``t`` is also the first after any instant in ``[t, slot)``, so a burst that
        advances its entries from one slot, or a sync registering a million rows over several
        seconds, computes each distinct schedule's next slot about once.

        The entry's bounds (``options.start_at``, ``options.end_at``) are its own, not its
        schedule's: they are applied outside the memo. No slot before ``start_at``; none at or
        after ``end_at``: the entry has no next slot then and stops quietly (no error); nor
        once it has used its ``options.max_runs``."""
        if entry.runs_left is not None and entry.runs_left <= 0:
            return None  # every run sent: the entry ends, as past end_at
        if entry.after is not None and entry.after > after:
            after = entry.after
        bounds = bounds_of(entry.options) if entry.options else NO_BOUNDS
        schedule = entry.schedule
        try:
            return slots.next_slot(schedule, after, bounds, self._find)
        except (OverflowError, ValueError) as exc:
            entry.last_error = str(exc)
        log.error(
            "schedule %s stops: %s", entry.name, entry.last_error, extra={"schedule": entry.name}
        )
        return None

    def _find(self, schedule: Schedule, after: datetime) -> datetime:
        """``schedule.next_after(after)``, memoised (see :meth:`next_after`); ValueError naming
        ``after`` when there is no slot before year 10000 (remembered too)."""
        memo = self._memo.get(schedule)
        if (
            memo is not None
            and memo[0] <= after
            and (type(memo[1]) is not datetime or after < memo[1])
        ):
            slot = memo[1]
        else:
            try:
                slot = schedule.next_after(after)
            except (OverflowError, ValueError) as exc:
                slot = f"no slot after {after.isoformat()}: {exc}"
            if len(self._memo) >= MEMO_MAX:
                self._memo.clear()
            self._memo[schedule] = (after, slot)
        if isinstance(slot, datetime):
            return slot
        raise ValueError(slot)

    def advance(self, entry: ScheduledEntry, after: datetime) -> None:
        """Move the entry to its first slot after ``after`` (filed, unless it died meanwhile)."""
        entry.next_slot = self.next_after(entry, after)
        if entry.next_slot is not None and not entry.dead:
            self.timetable.add(entry, entry.next_slot)

    def advance_jittered(self, entry: ScheduledEntry, after: datetime) -> None:
        """:meth:`advance` for an entry taken from :attr:`sends` (one with ``options.jitter``)."""
        entry.next_slot = self.next_after(entry, after)
        if entry.next_slot is not None and not entry.dead:
            self._file(entry, entry.next_slot)

    def _file(self, entry: ScheduledEntry, slot: datetime) -> None:
        """File the entry at its next slot: on the timetable, or, with ``options.jitter``, on
        :attr:`sends` at the slot's send instant (the entry's ``next_slot`` stays the slot)."""
        opts = entry.options
        if opts and "jitter" in opts:
            self.sends.add(entry, slot, send_at(entry.name, slot, jitter_of(opts)))
        else:
            self.timetable.add(entry, slot)

    async def rebase(
        self,
        after: datetime,
        settled: Mapping[Ident, datetime],
        counted: Mapping[Ident, Counted] | None = None,
    ) -> None:
        """Restart every entry at its first slot after ``after`` that it has not handled itself,
        that is after the schedule's latest settled slot (``settled``, by ident) and after its
        ``effective_at``: a takeover looks back, never at a slot sent or from before the
        schedule (or its timing) existed. In turns with the other tasks (a million entries); an
        entry registered meanwhile (new, or replacing one) is rebased as it is registered, one
        removed is left out. ``counted``: what the store records of every limited entry
        (options.max_runs), whose runs left are taken from it again."""
        now = self.clock.now()
        self.timetable.clear()
        self.sends.clear()
        counts = counted or {}
        # An entry registered meanwhile (the pass may have passed, or skipped as dead, its
        # ident) looks back as every other one does.
        with self._looking_back(_LookBack(after, settled, now, None)):
            async for part in in_turns(list(self._entries.items())):
                for ident, entry in part:
                    if not entry.dead:
                        self._rebase(entry, after, settled.get(ident), now, counts.get(ident))
        self._change()

    @contextlib.contextmanager
    def resuming(
        self, after: datetime, settled: Mapping[Ident, datetime], keep: Callable[[Ident], bool]
    ) -> Iterator[set[Ident]]:
        """While open, an entry registered (new here, or replacing one) whose ident ``keep``
        accepts is filed at its resumed slot as :meth:`rebase_some` files it (``now``: its
        registration's), its runs left from the ``counted`` of its registration. Yields the set
        of the idents so registered, less the limited ones registered without their count
        (their runs left are the caller's to read): the caller rebases the others, held
        already (a takeover of partitions registering a million rows computes each one's slot
        once, not twice)."""
        back = _LookBack(after, settled, None, keep)
        with self._looking_back(back):
            yield back.rebased

    @contextlib.contextmanager
    def _looking_back(self, back: _LookBack) -> Iterator[None]:
        assert self._back is None, "one takeover looks back at a time"
        self._back = back
        try:
            yield
        finally:
            self._back = None

    def rebase_some(
        self,
        entries: Sequence[ScheduledEntry],
        after: datetime,
        settled: Mapping[Ident, datetime],
        counted: Mapping[Ident, Counted] | None = None,
    ) -> None:
        """:meth:`rebase` for ``entries`` only, while the others keep their timing (a partition
        taken over by a manager that is sending for others). Their old filings go stale (an
        entry is valid only under its ``next_slot``). ``counted`` as for :meth:`rebase`."""
        now = self.clock.now()
        counts = counted or {}
        for entry in entries:
            if not entry.dead:
                self._rebase(entry, after, settled.get(entry.ident), now, counts.get(entry.ident))
        self._change()

    def _rebase(
        self,
        entry: ScheduledEntry,
        after: datetime,
        done: datetime | None,
        now: datetime,
        counted: Counted | None,
        *,
        fresh: bool = True,
    ) -> None:
        """Restart ``entry`` after ``after`` (see :meth:`rebase`); ``fresh``: a limited entry
        takes its runs left from ``counted`` (an entry registered during the rebase already
        did)."""
        opts = entry.options
        jitter = jitter_of(opts) if opts and "jitter" in opts else 0
        # With options.jitter a slot up to ``jitter`` before ``after`` may not be sent yet (its
        # send instant is later): look back that much more, in nominal slots.
        start = after - timedelta(microseconds=jitter) if jitter else after
        last = entry.fired
        if last is not None and last > start:
            start = last
        if done is not None and done > start:
            start = done
        floor = lookback_floor(entry, now)
        if floor is not None and floor > start:
            start = floor
        entry.after = start
        limit = max_runs_of(opts)
        if limit is not None and fresh:
            entry.runs_left = self._runs_left(entry, limit, counted, start)
        slot = entry.next_slot = self.next_after(entry, start)
        if jitter:
            # ... but not one whose send instant is at or before ``after`` (it had its turn).
            while slot is not None and send_at(entry.name, slot, jitter) <= after:
                slot = entry.next_slot = self.next_after(entry, slot)
        if slot is not None:
            self._file(entry, slot)

    def changed(self) -> None:
        """Count a change made to an entry outside this class (a staged batch is looked at
        again before it is sent)."""
        self._change()

    def _change(self) -> None:
        self.changes += 1
        self._changed()


def _within(slot: datetime, entry: ScheduledEntry) -> bool:
    """Whether ``slot`` is within the entry's bounds (options.start_at, options.end_at)."""
    if not entry.options:
        return True
    bounds = bounds_of(entry.options)
    return slots.floor_of(slot, bounds) == slot and not slots.ended(slot, bounds)


# The misfire policies that send missed slots after an outage, within their catch-up window.
CATCHING_UP = ("fire_once", "all")


def window_of(config: PeriodicTaskConfig, grace: timedelta, catchup_window: timedelta) -> timedelta:
    """How long after its slot a task may still be sent: grace, or the catch-up window of a
    ``fire_once`` or ``all`` schedule (targets keep their claim of the key that long), at most
    366 days."""
    opts = config.options
    window = grace
    if opts and opts.get("misfire") in CATCHING_UP:
        seconds = opts.get("catchup_window", catchup_window.total_seconds())
        window = max(window, timedelta(seconds=seconds))
    return min(window, MAX_WINDOW)


# How far a task's expiry may reach past its slot, whatever a (checked) option says.
MAX_WINDOW = timedelta(days=366)
