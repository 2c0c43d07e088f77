"""The scheduler: entries on a calendar of instants, one timing loop, one batch per instant.

Slot semantics:

* an entry's first slot is the first one strictly after it was registered (nothing fires at start);
* a due slot is enqueued when it is at most ``grace`` late; older slots are skipped (logged and
  counted) and never replayed: after a skip the entry jumps to the first slot after ``now - grace``,
  so a clock jumping forward never causes a storm;
* fire decisions use the clock's ``now``, re-read after every wake; a slot is never enqueued twice by
  one scheduler, even when the clock steps back or an entry is replaced (the last fired slot is kept
  per schedule key and new entries start after it);
* an edit never drops a slot: a replacement that keeps the timing and the name keeps the pending
  slot, and one that changes them still sends a slot of the old version that was already due;
* looking back (a takeover re-sending the last ``grace``) never reaches a slot at or before the
  schedule's ``effective_at`` (its creation, its last timing change or resume);
* an entry whose next slot cannot be computed (past year 9999) stops alone, with its error;
* all slots due at one instant go to the target as one batch;
* ``options.overlap`` skip and hold (:mod:`periodic_manager.engine.overlap`): a slot the target reports
  ``busy`` is recorded skipped, or held and tried again every ``hold_tick`` seconds while this
  scheduler leads (sent unstaged, through the normal send path); the entry's next slots go on.

Staging (:mod:`periodic_manager.engine.staging`): the next instant's batch is built before it, and at
the instant only the sending is left. Entries are :class:`~periodic_manager.engine.entry.ScheduledEntry`
objects; the calendar of instants is :mod:`periodic_manager.engine.timetable`, sending and its retries
:mod:`periodic_manager.engine.dispatch`, run history :mod:`periodic_manager.engine.history`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from periodic_manager.clock import SystemClock
from periodic_manager.contracts import Clock, RunRecord, Target
from periodic_manager.cron import Schedule
from periodic_manager.engine.dispatch import (
    Chunk,
    Dispatcher,
    ErrorHook,
    PostEnqueueHook,
    PreEnqueueHook,
    later,
    prepare,
)
from periodic_manager.engine.entry import CodeEntry, ScheduledEntry, lookback_floor, same_slots
from periodic_manager.engine.history import Observer, RunsHook, RunWriter
from periodic_manager.engine.overlap import HOLD_TICK_S, OverlapGuard
from periodic_manager.engine.staging import Staged, Stager
from periodic_manager.engine.timetable import Calendar
from periodic_manager.schedules.definition import PeriodicTaskConfig, ident_of
from periodic_manager.schedules.rules import overlap_policy
from periodic_manager.targets.base import staged

log = logging.getLogger(__name__)

__all__ = [
    "CodeEntry",
    "ErrorHook",
    "PostEnqueueHook",
    "PreEnqueueHook",
    "ScheduledEntry",
    "Scheduler",
    "lookback_floor",
]

IDLE_SLEEP_S = 3600.0  # with no entries, sleep long; register() wakes the loop anyway
RECORD_ON_STOP_TIMEOUT_S = 30.0
# How far a task's expiry may reach past its slot, whatever a (checked) option says.
MAX_WINDOW = timedelta(days=366)
YIELD_EVERY = 2000  # loops over a batch let other tasks (sync, leadership) run this often
MEMO_MAX = 100_000  # distinct schedules whose next slot is remembered (see _next)


class Scheduler:
    """Keeps entries on a calendar by next slot and sends due slots to a Target."""

    def __init__(
        self,
        target: Target,
        *,
        clock: Clock | None = None,
        grace: float = 30.0,
        pre_enqueue: PreEnqueueHook | None = None,
        post_enqueue: PostEnqueueHook | None = None,
        on_error: ErrorHook | None = None,
        on_runs: RunsHook | None = None,
        observe: Observer | None = None,
        catchup_window: float = 3600.0,
        retry_base: float = 0.2,
        retry_max: float = 5.0,
        hold_tick: float = HOLD_TICK_S,
    ) -> None:
        self.target = target
        self.clock: Clock = clock or SystemClock()
        self.overlap = OverlapGuard(tick_s=hold_tick, window=self.window)
        self.grace = timedelta(seconds=grace)
        self.catchup_window = timedelta(seconds=catchup_window)
        self._entries: dict[int | str, ScheduledEntry] = {}  # config.ident -> its entry
        self._calendar = Calendar()
        # The latest slot handled for schedules no longer registered (a pause, a delete): a
        # schedule that comes back soon never resends it. Entries keep their own (``fired``).
        self._retired: dict[int | str, datetime] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self._stop_event = asyncio.Event()
        self._state = asyncio.Condition()
        self._processed_until: datetime | None = None
        self._sleeping_until: datetime | None = None
        self._active = True
        self._idle = asyncio.Event()  # set while no dispatch is under way
        self._idle.set()
        self._changes = 0  # counts registrations, removals and rebases (see Staged.changes)
        self._memo: dict[Schedule, tuple[datetime, datetime | str]] = {}  # see _next
        self.writer = RunWriter(on_runs, observe=observe, retry_base=retry_base, changed=self._notify)
        self.dispatcher = Dispatcher(
            staged(target),
            clock=self.clock,
            writer=self.writer,
            backoff=self._backoff,
            may_send=lambda: not self._stopping and self._active,
            pre_enqueue=pre_enqueue,
            post_enqueue=post_enqueue,
            on_error=on_error,
            retry_base=retry_base,
            retry_max=retry_max,
            overlap=self.overlap,
        )
        self._stager = Stager(self._calendar, self.dispatcher.target, self._window, lambda: self._changes)

    @property
    def counts(self) -> dict[str, int]:
        """Slots handled so far, by outcome."""
        return self.dispatcher.counts

    # The hooks live on the dispatcher; they may be set after construction.
    @property
    def pre_enqueue(self) -> PreEnqueueHook | None:
        return self.dispatcher.pre_enqueue

    @pre_enqueue.setter
    def pre_enqueue(self, hook: PreEnqueueHook | None) -> None:
        self.dispatcher.pre_enqueue = hook

    @property
    def post_enqueue(self) -> PostEnqueueHook | None:
        return self.dispatcher.post_enqueue

    @post_enqueue.setter
    def post_enqueue(self, hook: PostEnqueueHook | None) -> None:
        self.dispatcher.post_enqueue = hook

    @property
    def on_error(self) -> ErrorHook | None:
        return self.dispatcher.on_error

    @on_error.setter
    def on_error(self, hook: ErrorHook | None) -> None:
        self.dispatcher.on_error = hook

    # -- entries -----------------------------------------------------------------------------

    def register(
        self,
        config: PeriodicTaskConfig,
        *,
        synced: bool = False,
        now: datetime | None = None,
    ) -> ScheduledEntry:
        """Add the entry of ``config``, replacing the one of the same key if any.

        A new schedule's first slot is strictly after now (and after the last slot this scheduler
        sent for its key). A replacement with the same timing and name keeps the pending slot,
        due or not; one that changes them starts strictly after now, but a slot of the old version
        that was already due and not yet sent is still sent: an edit never drops a slot.
        """
        if now is None:  # a sync registering many passes one instant (their next slots memoised)
            now = self.clock.now()
        ident = config.ident
        old = self._entries.get(ident)
        last = old.fired if old is not None else self._retired.pop(ident, None)
        entry = ScheduledEntry.of(config, now, prev_slot=last, after=now, fired=last, synced=synced)
        if old is not None and same_slots(old, config):
            entry.next_slot, entry.after = old.next_slot, old.after
            entry.prev_slot, entry.last_error = old.prev_slot, old.last_error
        else:
            entry.next_slot = self._next(entry, max(now, last) if last is not None else now)
            pending = old.next_slot if old is not None else None
            if pending is not None and pending <= now and (last is None or pending > last):
                entry.next_slot = pending  # due under the old version: carried, not dropped
        if old is not None:
            old.kill()
            if overlap_policy(config.options) == "allow":
                self.overlap.seen.pop(ident, None)  # nothing left to show (a held slot stays)
        self._changes += 1
        self._entries[ident] = entry
        if entry.next_slot is not None:
            self._calendar.add(entry, entry.next_slot)
        self._wake.set()
        return entry

    def unregister(self, key: int | str) -> ScheduledEntry | None:
        """Remove the entry of schedule ``key`` (the calendar forgets it lazily); it, or None."""
        ident = _ident(key)
        entry = self._entries.pop(ident, None)
        self.overlap.forget(ident)
        if entry is not None:
            entry.kill()
            if entry.fired is not None:
                self._retired[ident] = entry.fired
            self._changes += 1
            self._wake.set()
        return entry

    def get(self, key: int | str) -> ScheduledEntry | None:
        """The entry of schedule ``key`` (a key string, or an ident)."""
        return self._entries.get(_ident(key))

    def entries(self) -> list[ScheduledEntry]:
        return list(self._entries.values())

    def held(self) -> dict[int | str, ScheduledEntry]:
        """The entries by ident (the scheduler's own map: read it, do not change it)."""
        return self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def _next(self, entry: ScheduledEntry, after: datetime) -> datetime | None:
        """The entry's first slot strictly after ``after`` (and after ``entry.after``), or None
        when there is none before year 10000: that entry stops, the others go on.

        Memoised per schedule (shared by every row with the same spec, zone and anchor): a slot
        found after ``t`` is also the first after any instant in ``[t, slot)``, so a burst that
        advances its entries from one slot, or a sync registering a million rows over several
        seconds, computes each distinct schedule's next slot about once."""
        if entry.after is not None and entry.after > after:
            after = entry.after
        schedule = entry.schedule
        memo = self._memo.get(schedule)
        if memo is not None and memo[0] <= after and (type(memo[1]) is not datetime or after < memo[1]):
            slot = memo[1]
        else:
            try:
                slot = schedule.next_after(after)
            except (OverflowError, ValueError) as exc:
                slot = f"no slot after {after.isoformat()}: {exc}"
            if len(self._memo) >= MEMO_MAX:
                self._memo.clear()
            self._memo[schedule] = (after, slot)
        if type(slot) is datetime:
            return slot
        entry.last_error = slot
        log.error(
            "schedule %s stops: %s", entry.config.name, slot, extra={"schedule": entry.config.name}
        )
        return None

    def _advance(self, entry: ScheduledEntry, after: datetime) -> None:
        entry.next_slot = self._next(entry, after)
        if entry.next_slot is not None and not entry.dead:
            self._calendar.add(entry, entry.next_slot)

    def forget_retired(self, before: datetime) -> None:
        """Forget what was sent for schedules unregistered long ago (their last slot before
        ``before``): the map stays as small as the recent pauses and deletes."""
        self._retired = {k: v for k, v in self._retired.items() if v >= before}

    def window(self, entry: ScheduledEntry) -> timedelta:
        return self._window(entry.config)

    def _window(self, config: PeriodicTaskConfig) -> timedelta:
        """How long after its slot a task may still be sent: grace, or the catch-up window of a
        ``fire_once`` schedule (targets keep their claim of the key that long)."""
        opts = config.options
        window = self.grace
        if opts and opts.get("misfire") == "fire_once":
            seconds = opts.get("catchup_window", self.catchup_window.total_seconds())
            window = max(window, timedelta(seconds=seconds))
        return min(window, MAX_WINDOW)

    # -- lifecycle and leadership ------------------------------------------------------------

    async def run(self) -> None:
        """The timing loop; returns after :meth:`stop` (which may come before it even starts)."""
        writer = asyncio.ensure_future(
            self.writer.run(self._idle, lambda: self._stopping, self._quiet_backoff)
        )
        try:
            while not self._stopping:
                now = self.clock.now()
                if self._active:
                    await self._dispatch_due(now)
                    await self._retry_held(self.clock.now())
                    await self._stager.maybe_stage(self.clock.now())
                await self._mark_processed(now)
                await self._sleep_until_next()
        finally:
            # What was sent is recorded before the loop returns (a write under way finishes).
            self._stopping = True
            self._stager.unstage()
            self.writer.ready.set()
            try:
                await asyncio.wait_for(writer, RECORD_ON_STOP_TIMEOUT_S)
            except (TimeoutError, asyncio.CancelledError):
                log.warning("stopped before %d run(s) could be recorded", len(self.writer.pending))

    def stop(self) -> None:
        self._stopping = True
        self._stop_event.set()
        self._wake.set()

    @property
    def active(self) -> bool:
        return self._active

    def set_active(
        self,
        active: bool,
        *,
        resume_after: datetime | None = None,
        settled: Mapping[int | str, datetime] | None = None,
    ) -> None:
        """Start or stop dispatching (leadership). A standby keeps its entries but sends nothing.

        ``resume_after``: on a takeover, every entry restarts at its first slot after that instant
        (typically ``now - grace``) that it has not sent itself and that is after the schedule's
        latest slot the database records as settled (``settled``, by ident), so slots the
        old leader may have missed within grace are still sent, and none it settled is sent again
        even when the target's claims are gone (a broker that forgot its data).
        """
        if not active:
            self._stager.unstage()
            self.overlap.clear()
        if active and not self._active and resume_after is not None:
            self._rebase(resume_after, settled or {})
        self._active = active
        self._wake.set()

    def _rebase(self, after: datetime, settled: Mapping[int | str, datetime]) -> None:
        now = self.clock.now()
        self._changes += 1
        self._stager.unstage()
        self._calendar.clear()
        for ident, entry in self._entries.items():
            start = after
            last = entry.fired
            if last is not None and last > start:
                start = last
            done = settled.get(ident) if settled else None
            if done is not None and done > start:
                start = done
            floor = lookback_floor(entry.config, now)
            if floor is not None and floor > start:
                start = floor  # never a slot from before the schedule (or its timing) existed
            entry.after = start
            entry.next_slot = self._next(entry, start)
            if entry.next_slot is not None:
                self._calendar.add(entry, entry.next_slot)

    async def wait_idle(self) -> None:
        """Return when no dispatch is under way (background writers go between dispatches), or
        once the scheduler stops (a dispatch stuck in a hung target must not hold a shutdown)."""
        if self._idle.is_set() or self._stopping:
            return
        waits = [asyncio.ensure_future(self._idle.wait()), asyncio.ensure_future(self._stop_event.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in waits:
                fut.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    def hung_for(self, now: datetime) -> float:
        """Seconds a send under way has shown no sign of life (0 when idle or progressing).

        Every target call is bounded by its timeout and retries back off within grace, so a
        send that stays silent for minutes is stuck (a publish that never returns)."""
        return self.dispatcher.hung_for(now)

    # -- waiting ------------------------------------------------------------------------------

    async def wait_processed(self, instant: datetime) -> None:
        """Wait until every slot due at or before ``instant`` has been handled (for tests)."""

        def done() -> bool:
            if not self.writer.settled:
                return False
            if self._processed_until is not None and self._processed_until >= instant:
                return True
            return self._sleeping_until is not None and self._sleeping_until > instant

        async with self._state:
            await self._state.wait_for(done)

    async def _notify(self) -> None:
        async with self._state:
            self._state.notify_all()

    async def _mark_processed(self, now: datetime) -> None:
        at = self._calendar.next_instant() if self._active else None
        if at is not None and at <= now:
            return  # a backlog (after a takeover or a stall) takes one round per slot: not yet
        async with self._state:
            self._processed_until = now
            self._state.notify_all()

    def _wake_at(self) -> datetime | None:
        """When the loop must next run: the staged instant, or the next instant (or the time to
        stage it, if nothing is staged)."""
        if not self._active:
            return None
        at = self._stager.wake_at()
        held_at = self.overlap.wake_at()  # held slots are tried again at every tick
        if held_at is not None and (at is None or held_at < at):
            return held_at
        return at

    async def _sleep_until_next(self) -> None:
        wake_at = self._wake_at()
        if self._wake.is_set():
            self._wake.clear()
            return
        now = self.clock.now()
        if wake_at is not None and wake_at <= now:
            return
        async with self._state:
            self._sleeping_until = wake_at or later(now, IDLE_SLEEP_S)
            self._state.notify_all()
        # The sleeper measures the time left itself, when its timer is armed: whatever runs
        # before it first does (say the run-history writer preparing a burst's rows) cannot make
        # the wake late.
        sleeper = asyncio.ensure_future(
            self.clock.sleep_until(wake_at) if wake_at is not None else self.clock.sleep(IDLE_SLEEP_S)
        )
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (sleeper, waker):
                fut.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(sleeper, waker, return_exceptions=True)
            self._wake.clear()
            self._sleeping_until = None

    async def _backoff(self, delay: float) -> None:
        """Sleep ``delay`` on the clock, cut short by :meth:`stop` (the loop itself waits)."""
        async with self._state:
            self._sleeping_until = later(self.clock.now(), delay)
            self._state.notify_all()
        try:
            await self._quiet_backoff(delay)
        finally:
            self._sleeping_until = None

    async def _quiet_backoff(self, delay: float) -> None:
        sleeper = asyncio.ensure_future(self.clock.sleep(delay))
        stopper = asyncio.ensure_future(self._stop_event.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (sleeper, stopper):
                fut.cancel()
            await asyncio.gather(sleeper, stopper, return_exceptions=True)

    # -- dispatch ------------------------------------------------------------------------------

    async def _dispatch_due(self, now: datetime) -> None:
        """Send every instant due by ``now``, earliest first (a staged one included)."""
        while True:
            at = self._calendar.next_instant()
            batch = self._stager.staged
            if batch is not None and batch.slot <= now and (at is None or batch.slot <= at):
                slot = batch.slot
                self._stager.staged = None  # handed over; collection stays held until sent
            elif at is not None and at <= now:
                slot, batch = at, None
            else:
                return
            residual: list[ScheduledEntry] = self._calendar.take(slot)  # type: ignore[assignment]
            self._idle.clear()
            try:
                await self._dispatch(slot, batch, residual, now)
            finally:
                if batch is not None:
                    self._stager.release_gc()
                self._idle.set()

    async def _dispatch(
        self, slot: datetime, batch: Staged | None, residual: list[ScheduledEntry], now: datetime
    ) -> None:
        if (
            batch is not None
            and not residual
            and batch.changes == self._changes
            and now - slot <= self.grace
        ):
            # Nothing registered, replaced or removed since staging, which also found every
            # entry unsent: only the sending is left.
            await self._send(slot, batch.entries, batch.chunks, advance=True)
            return
        candidates = residual
        if batch is not None:
            # Entries replaced or removed since staging are dropped (a replacement due now is in
            # the residual, taken from the calendar).
            candidates = [e for e in batch.entries if not e.dead and e.next_slot == slot] + residual
        send: list[ScheduledEntry] = []
        skipped: list[RunRecord] = []
        late = now - slot > self.grace
        for entry in candidates:
            last = entry.fired
            if last is not None and slot <= last:
                # Already handled (clock stepped back, or an entry replaced at the same instant).
                self._advance(entry, last)
            elif late:
                skipped.append(self._skip(entry, slot, now))
            else:
                send.append(entry)
        self.writer.report(skipped)
        if not send:
            return
        if batch is not None and len(send) == len(batch.entries) and not residual:
            chunks = batch.chunks  # the common case: nothing changed since staging
        else:
            chunks = await prepare(self.dispatcher.target, slot, send, self._window)
        await self._send(slot, send, chunks, advance=True)

    async def _send(
        self, slot: datetime, entries: list[ScheduledEntry], chunks: list[Chunk], *, advance: bool
    ) -> None:
        sends = self.dispatcher.start(slot, chunks)
        try:
            # The requests go out first; the bookkeeping overlaps the target's work. (An entry
            # replaced meanwhile may carry this slot over: it meets last_fired, set below, when
            # its turn comes after this instant, and is not sent twice.)
            await asyncio.sleep(0)
            for entry in entries:
                if entry.fired is None or slot > entry.fired:
                    entry.fired = slot
            if advance:
                for i, entry in enumerate(entries):
                    entry.prev_slot = slot
                    self._advance(entry, slot)
                    if i % YIELD_EVERY == YIELD_EVERY - 1:
                        await asyncio.sleep(0)
            await asyncio.gather(*sends)
        except asyncio.CancelledError:
            for fut in sends:
                fut.cancel()
            raise

    async def _retry_held(self, now: datetime) -> None:
        """At a hold tick, send every held slot again (unstaged, the entries' timing untouched);
        a held slot past its window is recorded skipped."""
        due = self.overlap.take_due(now, self._entries.get)
        if due is None:
            return
        expired, by_slot = due
        self.writer.report(expired)
        self.counts["skipped"] += len(expired)
        for slot in sorted(by_slot):
            entries = by_slot[slot]
            self._idle.clear()
            try:
                chunks = await prepare(self.dispatcher.target, slot, entries, self._window)
                await self._send(slot, entries, chunks, advance=False)
            finally:
                self._idle.set()

    def _skip(self, entry: ScheduledEntry, slot: datetime, now: datetime) -> RunRecord:
        late = (now - slot).total_seconds()
        log.warning(
            "skipping slot %s of %s: %.3f s late (grace %.3f s)",
            slot.isoformat(), entry.config.name, late, self.grace.total_seconds(),
            extra={"schedule": entry.config.name, "slot": slot.isoformat(), "lateness_s": late},
        )
        self.counts["skipped"] += 1
        # Jump past every slot that is already too late: no replay, no storm after a clock jump.
        self._advance(entry, max(slot, now - self.grace))
        return RunRecord(
            entry.key, entry.config.name, slot, "skipped", now, error=f"{late:.3f} s late", reason="late"
        )

    async def catch_up(self, items: Sequence[tuple[ScheduledEntry, datetime]]) -> None:
        """Send missed slots once (misfire ``fire_once``), without moving the entries' timing."""
        by_slot: dict[datetime, list[ScheduledEntry]] = {}
        for entry, slot in items:
            by_slot.setdefault(slot, []).append(entry)
        for slot in sorted(by_slot):
            entries = by_slot[slot]
            log.info(
                "catching up %d missed slot(s) due %s", len(entries), slot.isoformat(),
                extra={"slot": slot.isoformat(), "batch": len(entries)},
            )
            chunks = await prepare(self.dispatcher.target, slot, entries, self._window)
            await self._send(slot, entries, chunks, advance=False)


def _ident(key: int | str) -> int | str:
    return ident_of(key) if isinstance(key, str) else key
