"""The scheduler: entries on a timetable of instants, one timing loop, one batch per instant.

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
  schedule's ``effective_at`` (its creation, its last timing change or resume), nor one the
  store records as settled;
* an entry whose next slot cannot be computed (past year 9999) stops alone, with its error;
* all slots due at one instant go to the target as one batch;
* ``options.overlap`` skip and hold (:mod:`periodic_manager.engine.overlap`): a slot the target
  reports ``busy`` is recorded skipped, or held and tried again every ``hold_tick`` seconds while
  this scheduler leads (sent unstaged, through the normal send path); the entry's next slots go on.

The parts: the registered entries and their next slots (:mod:`~periodic_manager.engine.entries`,
on a :mod:`~periodic_manager.engine.timetable`); the next instant's batch built before it
(:mod:`~periodic_manager.engine.staging`); what becomes of the due slots
(:mod:`~periodic_manager.engine.decisions`); sending (:mod:`~periodic_manager.engine.dispatch`),
with retries within grace beside the loop, never holding it (:mod:`~periodic_manager.engine.retries`); run history off the dispatch path
(:mod:`~periodic_manager.engine.history`). This module is the timing loop that drives them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta

from periodic_manager.clock import SystemClock, later, sleep_unless
from periodic_manager.contracts import Clock, SlotTracer, StateReader, Target
from periodic_manager.engine.decisions import Decisions
from periodic_manager.engine.dispatch import Dispatcher, Hooks
from periodic_manager.engine.entries import Counted, Entries, window_of
from periodic_manager.engine.entry import ScheduledEntry
from periodic_manager.engine.history import Observer, RunsHook, RunWriter
from periodic_manager.engine.overlap import HOLD_TICK_S, OverlapGuard
from periodic_manager.engine.staging import Stager
from periodic_manager.pacing import in_turns
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.rules import overlap_policy
from periodic_manager.targets.base import staged

log = logging.getLogger(__name__)

IDLE_SLEEP_S = 3600.0  # with no entries, sleep long; register() wakes the loop anyway
RECORD_ON_STOP_TIMEOUT_S = 30.0


class Scheduler:
    """Keeps entries on a timetable by next slot and sends due slots to a Target.

    ``on_runs`` receives the outcome of every slot in batches (the runtime store), ``observe``
    sees them at once (the metrics); ``hooks`` are called around every sub-batch sent;
    ``view_changed(entry)`` when what is published of an entry's overlap state changed;
    ``tracing`` (``PM_OTEL``) gives every batch sent a trace and records its spans.
    """

    def __init__(
        self,
        target: Target,
        *,
        clock: Clock | None = None,
        grace: float = 30.0,
        catchup_window: float = 3600.0,
        catchup_rate: float = 50.0,
        hooks: Hooks | None = None,
        on_runs: RunsHook | None = None,
        observe: Observer | None = None,
        retry_base: float = 0.2,
        retry_max: float = 5.0,
        hold_tick: float = HOLD_TICK_S,
        view_changed: Callable[[ScheduledEntry], None] | None = None,
        read_state: StateReader | None = None,
        tracing: SlotTracer | None = None,
    ) -> None:
        self.target = target
        self.clock: Clock = clock or SystemClock()
        self.grace = timedelta(seconds=grace)
        self.catchup_window = timedelta(seconds=catchup_window)
        self.catchup_rate = catchup_rate  # slots a second of a misfire "all" catch-up
        self._wake = asyncio.Event()
        self._stopping = False
        self._stop_event = asyncio.Event()
        self._retry_sleepers: set[asyncio.Event] = set()  # retries' pauses (fence, set_active)
        self._state = asyncio.Condition()
        self._processed_until: datetime | None = None
        self._sleeping_until: datetime | None = None
        self._active = True
        # Called right before every send attempt (partitions: the leases drop, and so fence
        # off, every partition whose trust has ended, even while a renewal is in flight).
        self.before_send: Callable[[], None] | None = None
        # Awaited at the start of every pass, before anything is sent (the manager's clock
        # watch: a wall-clock jump is measured before the next send).
        self.on_tick: Callable[[], Awaitable[None]] | None = None
        self._idle = asyncio.Event()  # set while no dispatch is under way
        self._idle.set()
        self.registered = Entries(self.clock, self._wake.set)
        self.overlap = OverlapGuard(tick_s=hold_tick, window=self.window, changed=view_changed)
        self.writer = RunWriter(
            on_runs, observe=observe, retry_base=retry_base, changed=self._notify
        )
        # PM_OTEL: batches stamped and traced (nothing when off).
        sending = staged(target) if tracing is None else tracing.wrap(staged(target), self.clock)
        self.dispatcher = Dispatcher(
            sending,
            clock=self.clock,
            writer=self.writer,
            backoff=self._retry_backoff,
            may_send=lambda: not self._stopping and self._active,
            hooks=hooks or Hooks(),
            retry_base=retry_base,
            retry_max=retry_max,
            overlap=self.overlap,
            fence=self._fence_now,
        )
        self._stager = Stager(
            self.registered.timetable,
            self.dispatcher.target,
            self._window,
            lambda: self.registered.changes,
        )
        self.decisions = Decisions(
            self.registered,
            self._stager,
            self.dispatcher,
            self.writer,
            self.overlap,
            grace=self.grace,
            window=self._window,
            idle=self._idle,
            read_state=read_state,
        )

    @property
    def counts(self) -> dict[str, int]:
        """Slots handled so far, by outcome."""
        return self.dispatcher.counts

    # -- entries -----------------------------------------------------------------------------

    def register(
        self,
        config: PeriodicTaskConfig,
        *,
        synced: bool = False,
        now: datetime | None = None,
        counted: Counted | None = None,
        start: datetime | None = None,
    ) -> ScheduledEntry:
        """Add the entry of ``config``, replacing the one of the same key if any (see
        :meth:`Entries.register <periodic_manager.engine.entries.Entries.register>`).

        ``now``: a sync registering many passes one instant (their next slots memoised);
        ``counted``: for a schedule with ``options.max_runs``, what the store records of it;
        ``start``: for a schedule new here, when its slots start (default ``now``)."""
        entry, old = self.registered.register(
            config,
            synced=synced,
            now=self.clock.now() if now is None else now,
            counted=counted,
            start=start,
        )
        if old is not None and overlap_policy(config.options) == "allow":
            self.overlap.seen.pop(entry.ident, None)  # nothing left to show (a held slot stays)
        return entry

    def unregister(self, key: int | str) -> ScheduledEntry | None:
        """Remove the entry of schedule ``key``; it, or None."""
        entry = self.registered.unregister(key)
        self.overlap.forget(entry.ident if entry is not None else key)
        return entry

    async def compact(self) -> int:
        """After many entries were unregistered at once: what they still held is given up
        (see :meth:`Entries.compact <periodic_manager.engine.entries.Entries.compact>`)."""
        return await self.registered.compact()

    def get(self, key: int | str) -> ScheduledEntry | None:
        """The entry of schedule ``key`` (a key string, or an ident)."""
        return self.registered.get(key)

    def entries(self) -> list[ScheduledEntry]:
        return list(self.registered.held().values())

    def held(self) -> dict[int | str, ScheduledEntry]:
        """The entries by ident (the scheduler's own map: read it, do not change it)."""
        return self.registered.held()

    def __len__(self) -> int:
        return len(self.registered)

    def forget_retired(self, before: datetime) -> None:
        """Forget what was sent for schedules unregistered long ago (see :class:`Entries`)."""
        self.registered.forget_retired(before)

    def window(self, entry: ScheduledEntry) -> timedelta:
        return self._window(entry)

    def _window(self, config: PeriodicTaskConfig) -> timedelta:
        return window_of(config, self.grace, self.catchup_window)

    async def catch_up(self, items: Sequence[tuple[ScheduledEntry, datetime]]) -> None:
        """Send missed slots once (misfire ``fire_once`` and ``all``), without moving the entries'
        timing."""
        await self.decisions.catch_up(items)

    # -- lifecycle and leadership ------------------------------------------------------------

    async def run(self) -> None:
        """The timing loop; returns after :meth:`stop` (which may come before it even starts)."""
        writer = asyncio.ensure_future(
            self.writer.run(self._idle, lambda: self._stopping, self._quiet_backoff)
        )
        try:
            while not self._stopping:
                if self.on_tick is not None:
                    await self.on_tick()
                now = self.clock.now()
                if self._active:
                    await self.decisions.dispatch_due(now)
                    await self.decisions.retry_held(self.clock.now())
                    await self._stager.maybe_stage(self.clock.now())
                await self._mark_processed(now)
                await self._sleep_until_next()
        finally:
            # What was sent is recorded before the loop returns (a write under way finishes);
            # the retries give up (their pauses end) and record their runs first.
            self._stopping = True
            self._stop_event.set()
            self._stager.unstage()
            await self.dispatcher.retries.close()
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
        """Whether this scheduler sends (see :meth:`set_active`)."""
        return self._active

    def set_active(self, active: bool) -> None:
        """Start or stop dispatching (leadership). A standby keeps its entries but sends nothing.
        A takeover :meth:`rebase` s the entries first."""
        if not active:
            self._stager.unstage()
            self.overlap.clear()
            self._wake_retries()  # a retry backing off gives up now, sending nothing more
        self._active = active
        self._wake.set()

    def _fence_now(self) -> Callable[[int | str], bool] | None:
        """The fence right before a send, after ``before_send`` (the leases drop what is no
        longer trusted)."""
        if self.before_send is not None:
            self.before_send()
        return self.decisions.fenced

    def fence(self, fenced: Callable[[int | str], bool] | None) -> None:
        """From now on send nothing for the idents ``fenced`` accepts (None: lift the fence):
        entries on their way out in turns (partitions lost) stop at once, before the pass that
        unregisters them; while a fence stands, a staged batch is looked at entry by entry
        before it is sent (see :class:`~periodic_manager.engine.decisions.Decisions`). A fenced
        entry that falls due leaves the timetable unsent: the caller unregisters it. A send
        backing off gives up at once if its entries are fenced (a hand-over waits for it: a
        broker that is down must not hold the hand-over)."""
        self.decisions.fenced = fenced
        if fenced is not None:
            self._wake_retries()

    async def rebase(
        self,
        resume_after: datetime,
        settled: Mapping[int | str, datetime] | None = None,
        counted: Mapping[int | str, Counted] | None = None,
    ) -> None:
        """Before a takeover activates this (inactive) scheduler: every entry restarts at its
        first slot after ``resume_after`` (typically ``now - grace``) that it has not sent itself
        and that is after the schedule's latest slot the database records as settled
        (``settled``, by ident), so slots the old leader may have missed within grace are still
        sent, and none it settled is sent again even when the target's claims are gone (a broker
        that forgot its data). ``counted``: what the database records of every entry with
        ``options.max_runs`` (runs counted, settled slot), by ident: its runs left are taken from
        it again. Runs in turns with the other tasks; does nothing while active.
        """
        if self._active:
            return
        self._stager.unstage()
        await self.registered.rebase(resume_after, settled or {}, counted)

    @contextlib.contextmanager
    def resuming(
        self,
        resume_after: datetime,
        settled: Mapping[int | str, datetime],
        keep: Callable[[int | str], bool],
    ) -> Iterator[set[int | str]]:
        """While open, the entries registered new whose ident ``keep`` accepts are filed as
        :meth:`rebase_some` would file them; yields their idents (see
        :meth:`Entries.resuming <periodic_manager.engine.entries.Entries.resuming>`)."""
        with self.registered.resuming(resume_after, settled, keep) as rebased:
            yield rebased

    async def rebase_some(
        self,
        entries: Sequence[ScheduledEntry],
        resume_after: datetime,
        settled: Mapping[int | str, datetime],
        counted: Mapping[int | str, Counted] | None = None,
    ) -> None:
        """:meth:`rebase` for ``entries`` only, active or not (a partition taken over while this
        scheduler sends for others), in turns with the other tasks; ``counted`` as for
        :meth:`rebase`."""
        async for part in in_turns(entries):
            self.registered.rebase_some(part, resume_after, settled, counted)

    async def flush_runs(self) -> bool:
        """Wait until no dispatch is under way and every run reported so far is written to the
        store (a hand-over: the next holder reads what was settled). False when the store is
        failing and runs are left unwritten."""
        await self.wait_idle()
        await self.dispatcher.between_attempts()  # a retry's call under way ends first
        if self._stopping:
            return await self.writer.flush()  # the writer's loop has ended (or ends now)
        self.writer.ready.set()
        async with self._state:
            await self._state.wait_for(lambda: self.writer.settled)
        return not self.writer.pending

    async def wait_idle(self) -> None:
        """Return when no dispatch is under way (background writers go between dispatches), or
        once the scheduler stops (a dispatch stuck in a hung target must not hold a shutdown)."""
        if not self._idle.is_set() and not self._stopping:
            await sleep_unless(self.clock, self._idle, self._stop_event)

    def hung_for(self, now: datetime) -> float:
        """Seconds a send under way has shown no sign of life (0 when idle or progressing).

        Every target call is bounded by its timeout and retries (in the background) back off at
        most ``retry_max`` between calls within grace, so a send that stays silent for minutes is
        stuck (a publish that never returns)."""
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
        at = self.registered.timetable.next_instant() if self._active else None
        if at is not None and at <= now:
            return  # a backlog (after a takeover or a stall) takes one round per slot: not yet
        send_at = self.registered.sends.next_instant() if self._active else None
        if send_at is not None and send_at <= now:
            return
        async with self._state:
            self._processed_until = now
            self._state.notify_all()

    def _wake_at(self) -> datetime | None:
        """When the loop must next run: the staged instant, or the next instant (or the time to
        stage it, if nothing is staged)."""
        if not self._active:
            return None
        at = self._stager.wake_at()
        send_at = self.registered.sends.next_instant()  # options.jitter: unstaged send instants
        if send_at is not None and (at is None or send_at < at):
            at = send_at
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
        try:
            # Until ``wake_at``: the sleeper measures the time left when its timer is armed, so
            # whatever runs before it first does (the run-history writer preparing a burst's
            # rows, say) cannot make the wake late.
            await sleep_unless(
                self.clock, self._wake, until=wake_at, seconds=None if wake_at else IDLE_SLEEP_S
            )
        finally:
            self._wake.clear()
            self._sleeping_until = None

    async def _retry_backoff(self, delay: float) -> None:
        """A retry's pause (:mod:`~periodic_manager.engine.retries`): ``delay`` on the clock, cut
        short by :meth:`stop`, by a fence raised (:meth:`fence`) and by sending stopping
        (:meth:`set_active`), so a hand-over never waits out a backoff. Each pause has its own
        event: one pause starting never hides a wake-up from another."""
        woken = asyncio.Event()
        self._retry_sleepers.add(woken)
        try:
            await sleep_unless(self.clock, self._stop_event, woken, seconds=delay)
        finally:
            self._retry_sleepers.discard(woken)

    def _wake_retries(self) -> None:
        for woken in self._retry_sleepers:
            woken.set()

    async def _quiet_backoff(self, delay: float) -> None:
        """Sleep ``delay`` on the clock, cut short by :meth:`stop` (retries, the writer)."""
        await sleep_unless(self.clock, self._stop_event, seconds=delay)
