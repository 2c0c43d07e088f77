"""What becomes of the slots that are due: sent, skipped as late, or found handled already.

At each due instant the scheduler's loop hands over the instant's entries: the batch staged
before it (:mod:`staging`), and any entry due then that was not in it (registered, replaced or
rebased since). Only the sending is left when nothing changed since staging; otherwise each entry
is looked at again:

* a slot at or before the last one this scheduler handled for the schedule (the clock stepped
  back, an entry replaced at the same instant) is not sent again: the entry moves on;
* a slot more than ``grace`` late is skipped (logged, counted, recorded) and never replayed: the
  entry jumps to the first slot after ``now - grace``, so a clock jumping forward causes no storm;
* a slot on a date of a calendar the schedule's ``options.exclude`` names is skipped (recorded,
  error ``excluded: ...``) and the entry moves on to its next slot;
* every other is sent, all of one instant as one batch, and the entries advance to their next
  slot.

Held slots (``options.overlap`` hold, :mod:`overlap`) are sent again at each hold tick without
moving their entries, and a ``fire_once`` catch-up sends missed slots the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from periodic_manager.contracts import RunRecord, StateReader
from periodic_manager.engine.dispatch import Chunk, Dispatcher, prepare
from periodic_manager.engine.entries import Entries
from periodic_manager.engine.entry import ScheduledEntry
from periodic_manager.engine.history import RunWriter
from periodic_manager.engine.lines import log_slots
from periodic_manager.engine.overlap import OverlapGuard
from periodic_manager.engine.staging import Staged, Stager
from periodic_manager.errors import cause
from periodic_manager.pacing import in_turns
from periodic_manager.schedules import slots
from periodic_manager.schedules.calendars import skip_reason
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.jitter import offset_of
from periodic_manager.schedules.runs import max_runs_of, runs_left

log = logging.getLogger(__name__)

# How long a send waits for the store's count of runs left (options.max_runs) before it goes on
# with this manager's own count: a slow or hung database must not hold back every schedule due.
RECOUNT_BOUND_S = 1.0


class Decisions:
    """Sends, skips or passes over the due slots of a scheduler's entries."""

    def __init__(
        self,
        entries: Entries,
        stager: Stager,
        dispatcher: Dispatcher,
        writer: RunWriter,
        overlap: OverlapGuard,
        *,
        grace: timedelta,
        window: Callable[[PeriodicTaskConfig], timedelta],
        idle: asyncio.Event,
        read_state: StateReader | None = None,
        recount_bound: float = RECOUNT_BOUND_S,
    ) -> None:
        self.entries = entries
        self.stager = stager
        self.dispatcher = dispatcher
        self.writer = writer
        self.overlap = overlap
        self.grace = grace
        self.window = window  # how long after its slot a schedule's task may still be sent
        self.idle = idle  # set while no dispatch is under way (background writers go between)
        # What the store records of schedules (options.max_runs: the runs a backfill used too).
        self.read_state = read_state
        self.recount_bound = recount_bound
        # The idents not to send for at all (entries being dropped in turns: their partitions
        # were lost or handed over); None, the common case: every entry may be sent.
        self.fenced: Callable[[int | str], bool] | None = None

    async def dispatch_due(self, now: datetime) -> None:
        """Send every instant due by ``now``, earliest first (a staged one included)."""
        timetable = self.entries.timetable
        sends = self.entries.sends
        while True:
            at = timetable.next_instant()
            batch = self.stager.staged
            slot: datetime | None = None
            if batch is not None and batch.slot <= now and (at is None or batch.slot <= at):
                slot = batch.slot
            elif at is not None and at <= now:
                slot, batch = at, None
            send_at = sends.next_instant()  # entries with options.jitter (none: None at once)
            if send_at is not None and send_at <= now and (slot is None or send_at < slot):
                self.idle.clear()
                try:
                    await self._dispatch_jittered(send_at, now)
                finally:
                    self.idle.set()
                continue
            if slot is None:
                return
            if batch is not None:
                self.stager.staged = None  # handed over; collection stays held until sent
            residual: list[ScheduledEntry] = timetable.take(slot)  # type: ignore[assignment]
            self.idle.clear()
            try:
                await self._dispatch(slot, batch, residual, now)
            finally:
                if batch is not None:
                    self.stager.release_gc()
                self.idle.set()

    async def _dispatch(
        self, slot: datetime, batch: Staged | None, residual: list[ScheduledEntry], now: datetime
    ) -> None:
        if (
            batch is not None
            and not residual
            and self.fenced is None
            and batch.changes == self.entries.changes
            and now - slot <= self.grace
            and not self._waits(batch.entries)
            and not self._recounts(batch.entries)
        ):
            # Nothing registered, replaced or removed since staging, which also found every
            # entry unsent: only the sending is left.
            await self.send(slot, batch.entries, batch.chunks, advance=True)
            return
        candidates = residual
        if batch is not None:
            # Entries replaced or removed since staging are dropped (a replacement due now is in
            # the residual, taken from the timetable).
            candidates = [e for e in batch.entries if not e.dead and e.next_slot == slot] + residual
        candidates = self._unfenced(candidates)
        send: list[ScheduledEntry] = []
        skipped: list[RunRecord] = []
        late = now - slot > self.grace
        for entry in candidates:
            last = entry.fired
            if entry.runs_left is not None and entry.runs_left <= 0:
                continue  # options.max_runs used up since it was filed: it ends here
            if last is not None and slot <= last:
                # Already handled (clock stepped back, or an entry replaced at the same instant).
                self.entries.advance(entry, last)
            elif late:
                skipped.append(self._skip(entry, slot, now))
            elif entry.exclusion is not None and (calendar := slots.excluded(entry, slot)):
                skipped.append(self._exclude(entry, slot, now, calendar, self.entries.advance))
            else:
                send.append(entry)
        send = await self._recorded_first(send, slot, now, skipped)
        self._report_skipped(slot, skipped, now)
        if not send:
            return
        if batch is not None and len(send) == len(batch.entries) and not residual:
            chunks = batch.chunks  # the common case: nothing changed since staging
        else:
            chunks = await prepare(self.dispatcher.target, slot, send, self.window)
        await self.send(slot, send, chunks, advance=True)

    async def _dispatch_jittered(self, at: datetime, now: datetime) -> None:
        """Send the entries whose send instant (slot + jitter offset) is ``at``: one batch per
        nominal slot (tasks, keys and history carry the slot), lateness and expiry measured from
        ``at``. Never staged: jittered sends are spread out, so their batches are small."""
        by_slot: dict[datetime, list[ScheduledEntry]] = {}
        taken: list[ScheduledEntry] = self.entries.sends.take(at)  # type: ignore[assignment]
        for entry in self._unfenced(taken):
            if entry.next_slot is not None:
                by_slot.setdefault(entry.next_slot, []).append(entry)
        late = now - at > self.grace
        for slot in sorted(by_slot):
            send: list[ScheduledEntry] = []
            skipped: list[RunRecord] = []
            for entry in by_slot[slot]:
                last = entry.fired
                if last is not None and slot <= last:
                    self.entries.advance_jittered(entry, last)
                elif late:
                    skipped.append(self._skip(entry, slot, now, since=at))
                elif entry.exclusion is not None and (calendar := slots.excluded(entry, slot)):
                    move = self.entries.advance_jittered
                    skipped.append(self._exclude(entry, slot, now, calendar, move))
                else:
                    send.append(entry)
            send = await self._recorded_first(send, slot, now, skipped, since=at)
            self._report_skipped(slot, skipped, now, since=at)
            if not send:
                continue
            chunks = await prepare(
                self.dispatcher.target, slot, send, _shifted(self.window, at - slot)
            )
            await self.send(slot, send, chunks, advance=True, jittered=True)

    async def send(
        self,
        slot: datetime,
        entries: list[ScheduledEntry],
        chunks: list[Chunk],
        *,
        advance: bool,
        jittered: bool = False,
    ) -> None:
        """Send ``chunks`` (the tasks of ``entries`` for ``slot``); with ``advance`` the entries
        move on to their next slot while the target works (``jittered``: entries taken from the
        send table, filed back there)."""
        move = self.entries.advance_jittered if jittered else self.entries.advance
        sends = self.dispatcher.start(slot, chunks)
        try:
            # The requests go out first; the bookkeeping overlaps the target's work. (An entry
            # replaced meanwhile may carry this slot over: it meets ``fired``, set below, when its
            # turn comes after this instant, and is not sent twice.)
            await asyncio.sleep(0)
            ended = False
            for entry in entries:
                if entry.fired is None or slot > entry.fired:
                    entry.fired = slot
                    if entry.runs_left is not None:  # options.max_runs: one run used
                        entry.runs_left -= 1
                        if entry.runs_left <= 0 and not advance and entry.next_slot is not None:
                            entry.next_slot = None  # its last run was a catch-up: none after
                            ended = True
            if ended:
                self.entries.changed()  # a batch staged with such an entry is looked at again
            if advance:
                async for part in in_turns(entries):
                    for entry in part:
                        entry.prev_slot = slot
                        move(entry, slot)
            await asyncio.gather(*sends)
        except asyncio.CancelledError:
            for fut in sends:
                fut.cancel()
            raise

    async def retry_held(self, now: datetime) -> None:
        """At a hold tick, send every held slot again (unstaged, the entries' timing untouched);
        a held slot past its window is recorded skipped."""
        due = self.overlap.take_due(now, self.entries.held().get)
        if due is None:
            return
        expired, by_slot = due
        self.writer.report(expired)
        self.dispatcher.counts["skipped"] += len(expired)
        retrying = self.dispatcher.retries.pending
        for slot in sorted(by_slot):
            entries = self._unfenced(by_slot[slot])
            if retrying:  # a held slot whose send is being retried: not sent twice at once
                entries = [e for e in entries if (e.ident, slot) not in retrying]
            if not entries:
                continue
            self.idle.clear()
            try:
                chunks = await prepare(
                    self.dispatcher.target, slot, entries, _per_entry_shift(self.window, slot)
                )
                await self.send(slot, entries, chunks, advance=False)
            finally:
                self.idle.set()

    async def catch_up(self, items: Sequence[tuple[ScheduledEntry, datetime]]) -> None:
        """Send missed slots once (misfire ``fire_once`` and ``all``), without moving the
        entries' timing (a missed slot on an excluded date is not sent: it was never to be sent)."""
        by_slot: dict[datetime, list[ScheduledEntry]] = {}
        for entry, slot in items:
            if entry.exclusion is None or not slots.excluded(entry, slot):
                by_slot.setdefault(slot, []).append(entry)
        for slot in sorted(by_slot):
            entries = self._unfenced(by_slot[slot])
            if not entries:
                continue
            log.info(
                "catching up %d missed slot(s) due %s",
                len(entries),
                slot.isoformat(),
                extra={"slot": slot.isoformat(), "batch": len(entries)},
            )
            chunks = await prepare(self.dispatcher.target, slot, entries, self.window)
            await self.send(slot, entries, chunks, advance=False)

    def _unfenced(self, entries: list[ScheduledEntry]) -> list[ScheduledEntry]:
        """``entries`` less those fenced off (all of them while nothing is fenced)."""
        fenced = self.fenced
        return entries if fenced is None else [e for e in entries if not fenced(e.ident)]

    def _waits(self, entries: list[ScheduledEntry]) -> bool:
        """Whether one of ``entries`` has a sent run of options.max_runs not written yet."""
        unrecorded = self.writer.unrecorded
        return bool(unrecorded) and any(e.key in unrecorded for e in entries)

    async def _recorded_first(
        self,
        send: list[ScheduledEntry],
        slot: datetime,
        now: datetime,
        skipped: list[RunRecord],
        since: datetime | None = None,
    ) -> list[ScheduledEntry]:
        """``send`` without the entries with options.max_runs whose previous sent run cannot be
        written first (the store is down): their slot is skipped (it does not count). So at
        most one run of a limited schedule is ever sent and unrecorded, the one a manager
        that registers it counts as used (schedules/runs.py). Then :meth:`_recount`."""
        if not self._waits(send):
            return await self._recount(send)
        stuck = await self.writer.unrecorded_of([e.key for e in send if e.runs_left is not None])
        keep = []
        for entry in send:
            if entry.key in stuck:
                skipped.append(self._skip_unrecorded(entry, slot, jittered=since is not None))
            else:
                keep.append(entry)
        return await self._recount(keep)

    def _recounts(self, entries: list[ScheduledEntry]) -> bool:
        """Whether ``entries`` hold one with options.max_runs whose count is read again."""
        return (
            self.read_state is not None
            and bool(self.entries.limited)
            and any(e.runs_left is not None for e in entries)
        )

    async def _recount(self, send: list[ScheduledEntry]) -> list[ScheduledEntry]:
        """``send`` without the entries with options.max_runs that have no run left by what the
        store records (a backfill uses runs too: :mod:`periodic_manager.backfill`): each takes
        the fewer of its own runs left and the store's; one left with none ends here. A failed
        read, or one that takes longer than ``recount_bound``, keeps the runs left this manager
        counted (the store's count catches up at its next sync)."""
        if self.read_state is None or not self._recounts(send):
            return send
        limited = [e for e in send if e.runs_left is not None]
        try:
            async with asyncio.timeout(self.recount_bound):
                states = await self.read_state([e.key for e in limited])
        except Exception as exc:  # noqa: BLE001 - the store being down must not stop the send
            log.warning("reading the runs of options.max_runs failed: %s", cause(exc))
            return send
        ended: set[int] = set()
        for entry in limited:
            state, limit = states.get(entry.key), max_runs_of(entry.options)
            if state is None or limit is None or entry.runs_left is None:
                continue
            left = runs_left(limit, state.runs)
            if left < entry.runs_left:
                entry.runs_left = left
                if left <= 0:
                    entry.next_slot = None  # every run was used (by a backfill): it ends
                    ended.add(id(entry))
        if not ended:
            return send
        self.entries.changed()
        return [e for e in send if id(e) not in ended]

    def _report_skipped(
        self, slot: datetime, skipped: list[RunRecord], now: datetime, since: datetime | None = None
    ) -> None:
        """Record the slots ``skipped`` at ``slot`` (the run history has each one) and say so in
        one line per reason, however many schedules (engine/lines.py): those too late, those
        whose previous limited run is not recorded yet. Excluded ones are not said: a holiday
        may exclude every schedule, and that is no news."""
        late = [r.name for r in skipped if r.reason == "late"]
        if late:
            seconds = (now - (slot if since is None else since)).total_seconds()
            grace = self.grace.total_seconds()
            why = f"{seconds:.3f} s late (grace {grace:.3f} s)"
            log_slots(log, logging.WARNING, "skipping", slot, late, why)
        waiting = [r.name for r in skipped if r.reason == "unrecorded"]
        if waiting:
            why = "the previous run (options.max_runs) is not recorded yet"
            why += f" (store: {self.writer.failing})"
            log_slots(log, logging.WARNING, "skipping", slot, waiting, why)
        self.writer.report(skipped)

    def _skip_unrecorded(
        self, entry: ScheduledEntry, slot: datetime, *, jittered: bool
    ) -> RunRecord:
        """Skip a slot of a limited schedule whose previous run cannot be recorded (said by
        :meth:`_report_skipped`)."""
        self.dispatcher.counts["skipped"] += 1
        (self.entries.advance_jittered if jittered else self.entries.advance)(entry, slot)
        return RunRecord(
            entry.key,
            entry.name,
            slot,
            "skipped",
            self.entries.clock.now(),
            error="previous run not recorded",
            reason="unrecorded",
        )

    def _skip(
        self, entry: ScheduledEntry, slot: datetime, now: datetime, since: datetime | None = None
    ) -> RunRecord:
        """Skip a slot too late; ``since``: its send instant (options.jitter), else the slot
        (said by :meth:`_report_skipped`)."""
        late = (now - (slot if since is None else since)).total_seconds()
        self.dispatcher.counts["skipped"] += 1
        # Jump past every slot that is already too late: no replay, no storm after a clock jump.
        move = self.entries.advance if since is None else self.entries.advance_jittered
        move(entry, max(slot, now - self.grace))
        return RunRecord(
            entry.key, entry.name, slot, "skipped", now, error=f"{late:.3f} s late", reason="late"
        )

    def _exclude(
        self,
        entry: ScheduledEntry,
        slot: datetime,
        now: datetime,
        calendar: str,
        move: Callable[[ScheduledEntry, datetime], None],
    ) -> RunRecord:
        """Skip a slot on an excluded date (options.exclude): handled, not sent; the entry moves
        on to its next slot (the one after may be excluded too: each is met at its own time)."""
        reason = skip_reason(slot, entry.timezone, calendar)
        # No log line (a holiday may exclude a million): the run history has each one.
        self.dispatcher.counts["skipped"] += 1
        if entry.fired is None or slot > entry.fired:
            entry.fired = slot
        move(entry, slot)
        return RunRecord(
            entry.key, entry.name, slot, "skipped", now, error=reason, reason="excluded"
        )


def _shifted(
    window: Callable[[PeriodicTaskConfig], timedelta], offset: timedelta
) -> Callable[[PeriodicTaskConfig], timedelta]:
    """A jittered task may be sent ``window`` after its send instant: ``offset`` after its slot."""
    return lambda cfg: window(cfg) + offset


def _per_entry_shift(
    window: Callable[[PeriodicTaskConfig], timedelta], slot: datetime
) -> Callable[[PeriodicTaskConfig], timedelta]:
    """``window`` from each entry's send instant of ``slot`` (held slots: options.jitter)."""
    return lambda cfg: window(cfg) + offset_of(cfg, slot)
