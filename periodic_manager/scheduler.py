"""The scheduler: entries in a time-ordered heap, one timing loop, one batch per instant.

Slot semantics (design.md):

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
* all slots due at one instant go to the target as one batch.

The heap holds ``(next_slot, version, entry_id)``; replaced or removed entries are dropped
lazily when they surface, so register/unregister are O(log n) and a wake never scans all entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from periodic_manager.clock import Clock, SystemClock
from periodic_manager.config import (
    PeriodicTaskConfig,
    content_hash,
    entry_id,
    slot_text,
)
from periodic_manager.cron import Schedule
from periodic_manager.registry import RunRecord
from periodic_manager.targets.base import EnqueueResult, Target, Task, task_for

log = logging.getLogger(__name__)

PreEnqueueHook = Callable[[Sequence[Task]], Awaitable[None] | None]
PostEnqueueHook = Callable[[Sequence[EnqueueResult]], Awaitable[None] | None]
ErrorHook = Callable[[BaseException, Sequence[Task]], Awaitable[None] | None]
RunsHook = Callable[[Sequence[RunRecord]], Awaitable[None]]

IDLE_SLEEP_S = 3600.0
# Runs kept in memory while the store cannot record them (the oldest go first beyond this).
MAX_PENDING_RUNS = 100_000
RUNS_RETRY_MAX_S = 30.0
# How far a task's expiry may reach past its slot, whatever a (checked) option says.
MAX_WINDOW = timedelta(days=366)
_LATEST = datetime.max.replace(tzinfo=UTC)
SEND_CHUNK = 2000  # slots per sub-batch of a large instant (pipelined: sent while the next builds)
MAX_IN_FLIGHT = 4  # sub-batches awaiting the target at once
RECORD_ON_STOP_TIMEOUT_S = 30.0  # with no entries, sleep long; register() wakes the loop anyway


@dataclass(slots=True)
class ScheduledEntry:
    """One registered schedule: its config, parsed schedule and timing."""

    entry_id: str
    config: PeriodicTaskConfig
    schedule: Schedule
    content_hash: str
    registered_at: datetime
    next_slot: datetime | None  # None: no slot left (past year 9999)
    prev_slot: datetime | None = None
    last_error: str | None = None
    version: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    key: str = ""  # the config's key, cached: read several times per slot
    window: timedelta = timedelta(0)  # how long after a slot it may still be sent
    payload_json: str = "null"  # canonical JSON, computed once per entry, not once per slot
    options_json: str = "{}"
    # Slots of this entry are strictly after this instant, except a slot of the version it replaced
    # that was already due (carried over so an edit never drops it).
    after: datetime | None = None


async def _call(hook: Callable[..., Any] | None, *args: Any) -> None:
    if hook is None:
        return
    result = hook(*args)
    if asyncio.iscoroutine(result):
        await result


class Scheduler:
    """Keeps entries ordered by next slot and sends due slots to a Target."""

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
        observe: Callable[[Sequence[RunRecord]], None] | None = None,
        catchup_window: float = 3600.0,
        retry_base: float = 0.2,
        retry_max: float = 5.0,
    ) -> None:
        self.target = target
        self.clock: Clock = clock or SystemClock()
        self.grace = timedelta(seconds=grace)
        self.pre_enqueue = pre_enqueue
        self.post_enqueue = post_enqueue
        self.on_error = on_error
        self.on_runs = on_runs
        self.observe = observe  # sees every run once, when it happens (metrics)
        self._entries: dict[str, ScheduledEntry] = {}
        self._heap: list[tuple[datetime, int, str]] = []
        self._seq = itertools.count()
        self._last_fired: dict[str, datetime] = {}  # schedule key -> latest slot handled
        self._wake = asyncio.Event()
        self._stopping = False
        self._state = asyncio.Condition()
        self._processed_until: datetime | None = None
        self._sleeping_until: datetime | None = None
        self.counts: dict[str, int] = {"enqueued": 0, "duplicate": 0, "skipped": 0, "failed": 0}
        self.catchup_window = timedelta(seconds=catchup_window)
        self.retry_base = retry_base
        self.retry_max = retry_max
        self._active = True
        self._stop_event = asyncio.Event()
        self._failing = 0  # consecutive failed enqueue attempts (one log line per outage)
        self._inflight = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._idle = asyncio.Event()  # set while no dispatch is under way
        self._idle.set()
        self._pending_runs: list[RunRecord] = []
        self._runs_ready = asyncio.Event()
        self._writing = False
        self._runs_failing: str | None = None  # the store's error while history cannot be written
        self._runs_dropped = 0  # runs dropped in this outage (the buffer was full)
        self._runs_late = 0  # runs written late after this outage
        self._busy_since: datetime | None = None  # a dispatch under way since (clock time)
        self._progress_at: datetime | None = None  # its last sign of life (an attempt began/ended)

    # -- entries -----------------------------------------------------------------------------

    def register(
        self, config: PeriodicTaskConfig, *, digest: str | None = None, replaces: str | None = None
    ) -> ScheduledEntry:
        """Add an entry, or replace entry ``replaces`` (or one with the same entry id).

        A new schedule's first slot is strictly after now (and after the last slot this scheduler
        sent for its key). A replacement with the same timing and name keeps the pending slot,
        due or not; one that changes them starts strictly after now, but a slot of the old version
        that was already due and not yet sent is still sent: an edit never drops a slot.
        """
        digest = digest or content_hash(config)
        eid = entry_id(config, digest)
        now = self.clock.now()
        old = self._entries.get(replaces or eid)
        entry = ScheduledEntry(
            entry_id=eid,
            config=config,
            schedule=config.schedule,
            content_hash=digest,
            registered_at=now,
            next_slot=None,
            prev_slot=self._last_fired.get(config.key),
            # Versions are globally unique so a stale heap item can never match a re-created entry.
            version=next(self._seq),
            key=config.key,
            payload_json=config.payload_json,
            options_json=config.options_json,
            window=self._window(config),
            after=now,
        )
        if old is not None and _same_slots(old.config, config):
            entry.next_slot, entry.after = old.next_slot, old.after
            entry.prev_slot, entry.last_error = old.prev_slot, old.last_error
        else:
            last = self._last_fired.get(config.key)
            entry.next_slot = self._next(entry, max(now, last) if last is not None else now)
            pending = old.next_slot if old is not None else None
            if pending is not None and pending <= now and (last is None or pending > last):
                entry.next_slot = pending  # due under the old version: carried, not dropped
        if old is not None:
            self._entries.pop(old.entry_id, None)
        self._entries[eid] = entry
        if entry.next_slot is not None:
            heapq.heappush(self._heap, (entry.next_slot, entry.version, eid))
        self._wake.set()
        return entry

    def _next(self, entry: ScheduledEntry, after: datetime) -> datetime | None:
        """The entry's first slot strictly after ``after`` (and after ``entry.after``), or None
        when there is none before year 10000: that entry stops, the others go on."""
        if entry.after is not None and entry.after > after:
            after = entry.after
        try:
            return entry.schedule.next_after(after)
        except (OverflowError, ValueError) as exc:
            entry.last_error = f"no slot after {after.isoformat()}: {exc}"
            log.error(
                "schedule %s has no slot after %s and stops: %s", entry.config.name,
                after.isoformat(), exc, extra={"schedule": entry.config.name},
            )
            return None

    def unregister(self, eid: str) -> bool:
        """Remove an entry; its heap item is dropped lazily. Returns whether it existed."""
        removed = self._entries.pop(eid, None) is not None
        if removed:
            self._wake.set()
        return removed

    def get(self, eid: str) -> ScheduledEntry | None:
        return self._entries.get(eid)

    def entries(self) -> list[ScheduledEntry]:
        return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    # -- loop --------------------------------------------------------------------------------

    async def run(self) -> None:
        """The timing loop; returns after :meth:`stop`."""
        self._stopping = False
        self._stop_event.clear()
        writer = asyncio.ensure_future(self._write_runs())
        try:
            while not self._stopping:
                now = self.clock.now()
                if self._active:
                    await self._dispatch_due(now)
                await self._mark_processed(now)
                await self._sleep_until_next()
        finally:
            # What was sent is recorded before the loop returns (a write under way finishes).
            self._stopping = True
            self._runs_ready.set()
            try:
                await asyncio.wait_for(writer, RECORD_ON_STOP_TIMEOUT_S)
            except (TimeoutError, asyncio.CancelledError):
                log.warning("stopped before %d run(s) could be recorded", len(self._pending_runs))

    def stop(self) -> None:
        self._stopping = True
        self._stop_event.set()
        self._wake.set()

    @property
    def active(self) -> bool:
        return self._active

    def set_active(self, active: bool, *, resume_after: datetime | None = None) -> None:
        """Start or stop dispatching (leadership). A standby keeps its entries but sends nothing.

        ``resume_after``: on a takeover, every entry restarts at its first slot after that instant
        (typically ``now - grace``) that it has not sent itself, so slots the old leader may have
        missed within grace are still sent (the target's claim drops those it did send).
        """
        if active and not self._active and resume_after is not None:
            self._rebase(resume_after)
        self._active = active
        self._wake.set()

    def _rebase(self, after: datetime) -> None:
        now = self.clock.now()
        self._heap.clear()
        for entry in self._entries.values():
            start = after
            last = self._last_fired.get(entry.key)
            if last is not None and last > start:
                start = last
            floor = lookback_floor(entry.config, now)
            if floor is not None and floor > start:
                start = floor  # never a slot from before the schedule (or its timing) existed
            entry.after = start
            entry.next_slot = self._next(entry, start)
            entry.version = next(self._seq)
            if entry.next_slot is not None:
                self._heap.append((entry.next_slot, entry.version, entry.entry_id))
        heapq.heapify(self._heap)

    async def wait_processed(self, instant: datetime) -> None:
        """Wait until every slot due at or before ``instant`` has been handled (for tests)."""

        def done() -> bool:
            # Runs waiting for a store that is down do not hold anyone up.
            if self._writing or (self._pending_runs and self._runs_failing is None):
                return False
            if self._processed_until is not None and self._processed_until >= instant:
                return True
            return self._sleeping_until is not None and self._sleeping_until > instant

        async with self._state:
            await self._state.wait_for(done)

    async def _mark_processed(self, now: datetime) -> None:
        self._drop_stale()
        if self._active and self._heap and self._heap[0][0] <= now:
            return  # a backlog (after a takeover or a stall) takes one round per slot: not yet
        async with self._state:
            self._processed_until = now
            self._state.notify_all()

    async def _sleep_until_next(self) -> None:
        self._drop_stale()
        next_slot = self._heap[0][0] if self._heap and self._active else None
        if self._wake.is_set():
            self._wake.clear()
            return
        now = self.clock.now()
        delay = (next_slot - now).total_seconds() if next_slot else IDLE_SLEEP_S
        if delay <= 0:
            return
        async with self._state:
            self._sleeping_until = next_slot or _later(now, delay)
            self._state.notify_all()
        sleeper = asyncio.ensure_future(self.clock.sleep(delay))
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

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap:
            _, version, eid = heap[0]
            entry = self._entries.get(eid)
            if entry is not None and entry.version == version:
                return
            heapq.heappop(heap)

    def _pop_due(self, now: datetime) -> list[ScheduledEntry]:
        """Pop every live entry whose next slot is <= now, earliest first."""
        due: list[ScheduledEntry] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, version, eid = heapq.heappop(heap)
            entry = self._entries.get(eid)
            if entry is not None and entry.version == version:
                due.append(entry)
        return due

    async def _dispatch_due(self, now: datetime) -> None:
        due = self._pop_due(now)
        if not due:
            return
        self._idle.clear()
        self._busy_since = self._progress_at = now
        try:
            await self._dispatch(due, now)
        finally:
            self._busy_since = self._progress_at = None
            self._idle.set()

    def hung_for(self, now: datetime) -> float:
        """Seconds a dispatch under way has shown no sign of life (0 when idle or progressing).

        Every target call is bounded by its timeout and retries back off within grace, so a
        dispatch that stays silent for minutes is stuck (a publish that never returns)."""
        progress = self._progress_at
        if progress is None:
            return 0.0
        return max(0.0, (now - progress).total_seconds())

    async def _dispatch(self, due: list[ScheduledEntry], now: datetime) -> None:
        batches: dict[datetime, list[ScheduledEntry]] = {}
        skipped: list[RunRecord] = []
        for entry in due:
            slot = entry.next_slot
            assert slot is not None  # only entries with a slot are in the heap
            last = self._last_fired.get(entry.key)
            if last is not None and slot <= last:
                # Already handled (clock stepped back, or an entry replaced at the same instant).
                self._advance(entry, last)
            elif now - slot > self.grace:
                skipped.append(self._skip(entry, slot, now))
            else:
                batches.setdefault(slot, []).append(entry)
        if skipped:
            await self._report(skipped)
        for slot in sorted(batches):
            await self._enqueue_batch(slot, batches[slot], now)

    def _advance(self, entry: ScheduledEntry, after: datetime) -> None:
        entry.next_slot = self._next(entry, after)
        entry.version = next(self._seq)
        if entry.next_slot is not None:
            heapq.heappush(self._heap, (entry.next_slot, entry.version, entry.entry_id))

    def _skip(self, entry: ScheduledEntry, slot: datetime, now: datetime) -> RunRecord:
        late = (now - slot).total_seconds()
        log.warning(
            "skipping slot %s of %s: %.3f s late (grace %.3f s)",
            slot.isoformat(), entry.config.name, late, self.grace.total_seconds(),
            extra={"schedule": entry.config.name, "slot": slot.isoformat(), "lateness_s": late},
        )
        self.counts["skipped"] += 1
        entry.counts["skipped"] = entry.counts.get("skipped", 0) + 1
        # Jump past every slot that is already too late: no replay, no storm after a clock jump.
        self._advance(entry, max(slot, now - self.grace))
        return RunRecord(entry.key, entry.config.name, slot, "skipped", now, error=f"{late:.3f} s late")

    def window(self, entry: ScheduledEntry) -> timedelta:
        return entry.window

    def _window(self, config: PeriodicTaskConfig) -> timedelta:
        """How long after its slot a task may still be sent: grace, or the catch-up window of a
        ``fire_once`` schedule (targets keep their claim of the key that long)."""
        opts = config.options
        window = self.grace
        if opts.get("misfire") == "fire_once":
            seconds = opts.get("catchup_window", self.catchup_window.total_seconds())
            window = max(window, timedelta(seconds=seconds))
        return min(window, MAX_WINDOW)

    def _task(self, entry: ScheduledEntry, slot: datetime, text: str) -> Task:
        # Near year 9999 the expiry saturates rather than overflows.
        expires = slot + entry.window if _LATEST - slot > entry.window else _LATEST
        return task_for(entry.config, f"{entry.config.name}:{text}", slot, expires)

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
            await self._enqueue_batch(slot, entries, self.clock.now(), advance=False)

    async def _enqueue_batch(
        self, slot: datetime, entries: list[ScheduledEntry], now: datetime, *, advance: bool = True
    ) -> None:
        """Send one instant's slots. A large batch goes out as pipelined sub-batches of
        ``SEND_CHUNK``: each is sent as soon as it is built, so the target works on one while the
        next is being built (hooks see each sub-batch)."""
        text = slot_text(slot)  # shared by the whole batch
        sends: list[asyncio.Future[None]] = []
        chunk_tasks: list[Task] = []
        chunk_entries: list[ScheduledEntry] = []
        for entry in entries:
            chunk_tasks.append(self._task(entry, slot, text))
            chunk_entries.append(entry)
            self._last_fired[entry.key] = max(slot, self._last_fired.get(entry.key, slot))
            if advance:
                entry.prev_slot = slot
                self._advance(entry, slot)
            if len(chunk_tasks) >= SEND_CHUNK:
                sends.append(asyncio.ensure_future(self._send_chunk(slot, chunk_entries, chunk_tasks)))
                chunk_tasks, chunk_entries = [], []
                # Let the sub-batch go out (and leadership checks run) before building the next.
                await asyncio.sleep(0)
        if chunk_tasks:
            sends.append(asyncio.ensure_future(self._send_chunk(slot, chunk_entries, chunk_tasks)))
        try:
            await asyncio.gather(*sends)
        except asyncio.CancelledError:
            for fut in sends:
                fut.cancel()
            raise

    async def _send_chunk(self, slot: datetime, entries: list[ScheduledEntry], tasks: list[Task]) -> None:
        try:
            # A few sub-batches in flight keep the target busy; more would only queue for its
            # connections inside their own timeouts.
            async with self._inflight:
                await _call(self.pre_enqueue, tasks)
                results = await self._send(tasks, slot)
        except Exception as exc:  # noqa: BLE001 - any target failure is reported, never fatal
            at = self.clock.now()
            for entry in entries:
                entry.last_error = str(exc)
            self.counts["failed"] += len(tasks)
            log.error(
                "gave up on %d task(s) due %s: %s", len(tasks), slot.isoformat(), exc,
                extra={"slot": slot.isoformat(), "batch": len(tasks)},
            )
            await self._safe_hook(self.on_error, exc, tasks)
            await self._report([RunRecord(e.key, e.config.name, slot, "failed", at, error=str(exc)) for e in entries])
            return
        runs: list[RunRecord] = []
        at = self.clock.now()
        counts = self.counts
        for entry, res in zip(entries, results, strict=True):
            status = res.status
            if res.error is not None or entry.next_slot is not None:  # keep "no slot left"
                entry.last_error = res.error  # set when the target failed this task alone
            if status == "failed":
                log.error(
                    "enqueue of %s due %s failed: %s", entry.config.name, slot.isoformat(), res.error,
                    extra={"schedule": entry.config.name, "slot": slot.isoformat()},
                )
            entry.counts[status] = entry.counts.get(status, 0) + 1
            counts[status] += 1
            runs.append(RunRecord(entry.key, entry.config.name, slot, status, at, res.message_id, res.error))
        log.debug("enqueued %d task(s) due %s", len(tasks), slot.isoformat(), extra={"slot": slot.isoformat()})
        await self._safe_hook(self.post_enqueue, results)
        await self._report(runs)

    async def _send(self, tasks: list[Task], slot: datetime) -> list[EnqueueResult]:
        """Enqueue, retrying with capped exponential backoff while the batch may still be sent.

        A failed call is retried whole; tasks a target reports ``failed`` one by one (e.g. one
        target of a routing target down) are retried alone. Gives up once the next attempt would
        fall after the deadline, on shutdown, or when leadership is lost: re-raising if nothing
        was sent, else reporting the rest as failed. Logs once per outage, not once per attempt.
        """
        deadline = min(t.expires_at for t in tasks)
        final: list[EnqueueResult | None] = [None] * len(tasks)
        todo = list(range(len(tasks)))
        attempt = 0
        while True:
            error: Exception | None = None
            self._progress_at = self.clock.now()
            try:
                results = await self.target.enqueue([tasks[i] for i in todo], self.clock.now())
            except Exception as exc:
                error = exc
                self._progress_at = self.clock.now()
            else:
                self._progress_at = self.clock.now()
                retry = []
                for i, res in zip(todo, results, strict=True):
                    final[i] = res
                    if res.status == "failed":
                        retry.append(i)
                if not retry:
                    if self._failing:
                        log.warning("target recovered after %d failed attempt(s)", self._failing)
                        self._failing = 0
                    return [r for r in final if r is not None]
                todo = retry
            attempt += 1
            self._failing += 1
            if self._failing == 1:
                log.error(
                    "enqueue failed, retrying while slots are within grace: %s",
                    error if error is not None else final[todo[0]].error,  # type: ignore[union-attr]
                    extra={"slot": slot.isoformat(), "batch": len(todo)},
                )
            delay = min(self.retry_max, self.retry_base * 2 ** (attempt - 1))
            if self._stopping or not self._active or _later(self.clock.now(), delay) > deadline:
                if error is not None and all(r is None for r in final):
                    raise error
                for i in todo:
                    if error is not None:
                        final[i] = EnqueueResult(tasks[i], "failed", None, error=str(error))
                return [r for r in final if r is not None]
            await self._backoff(delay)

    async def _backoff(self, delay: float, *, announce: bool = True) -> None:
        """Sleep ``delay`` on the clock, cut short by :meth:`stop`. ``announce``: the timing loop
        itself is waiting (:meth:`wait_processed` may consider everything until then handled)."""
        if announce:
            async with self._state:
                self._sleeping_until = _later(self.clock.now(), delay)
                self._state.notify_all()
        sleeper = asyncio.ensure_future(self.clock.sleep(delay))
        stopper = asyncio.ensure_future(self._stop_event.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (sleeper, stopper):
                fut.cancel()
            await asyncio.gather(sleeper, stopper, return_exceptions=True)
            if announce:
                self._sleeping_until = None

    async def _safe_hook(self, hook: Callable[..., Any] | None, *args: Any) -> None:
        try:
            await _call(hook, *args)
        except Exception:  # a user hook must not stop the schedule
            log.exception("hook %r failed", hook)

    async def _report(self, runs: Sequence[RunRecord]) -> None:
        """Hand runs to the writer: recording never delays the next dispatch."""
        if not runs:
            return
        if self.observe is not None:
            try:
                self.observe(runs)
            except Exception:  # metrics must not stop the schedule
                log.exception("observing %d run(s) failed", len(runs))
        if self.on_runs is not None:
            self._pending_runs.extend(runs)
            self._trim_runs()
            self._runs_ready.set()

    def _trim_runs(self) -> None:
        excess = len(self._pending_runs) - MAX_PENDING_RUNS
        if excess > 0:  # the store has been down for long: the oldest history goes first
            del self._pending_runs[:excess]
            self._runs_dropped += excess

    async def _write_runs(self) -> None:
        """Record pending runs as they come, coalescing batches that arrive while writing.

        While the store fails, runs wait in memory (at most ``MAX_PENDING_RUNS``, the oldest
        dropped beyond) and are retried with backoff; one line when the outage starts, one when
        it ends saying how many runs were written late and how many were dropped."""
        delay = self.retry_base
        while True:
            await self._runs_ready.wait()
            # Dispatch first: a burst's CPU goes to sending; its records follow right after.
            await self._idle.wait()
            self._runs_ready.clear()
            ok = await self._flush_runs()
            if self._stopping and (ok or not self._pending_runs):
                return
            if ok:
                delay = self.retry_base
                continue
            if self._stopping:
                log.warning(
                    "stopping with %d run(s) of history not recorded (store: %s)",
                    len(self._pending_runs), self._runs_failing,
                )
                return
            await self._backoff(delay, announce=False)
            delay = min(RUNS_RETRY_MAX_S, delay * 2)
            self._runs_ready.set()

    async def _flush_runs(self) -> bool:
        if not self._pending_runs or self.on_runs is None:
            return True
        runs, self._pending_runs = self._pending_runs, []
        self._writing = True
        try:
            await self.on_runs(runs)
        except Exception as exc:  # the store being down must not stop the schedule
            # Back in front of anything newer, so history is written in order once it can be.
            self._pending_runs[:0] = runs
            self._trim_runs()
            if self._runs_failing is None:
                log.error(
                    "recording run history failed; keeping up to %d run(s) in memory and retrying: %s",
                    MAX_PENDING_RUNS, exc,
                )
            self._runs_failing = f"{type(exc).__name__}: {exc}"
            return False
        else:
            if self._runs_failing is not None:
                self._runs_late += len(runs)
                log.warning(
                    "run history recorded again: %d run(s) written late, %d dropped while the "
                    "store was unreachable", self._runs_late, self._runs_dropped,
                )
                self._runs_failing = None
                self._runs_late = self._runs_dropped = 0
            return True
        finally:
            self._writing = False
            async with self._state:
                self._state.notify_all()


def _same_slots(a: PeriodicTaskConfig, b: PeriodicTaskConfig) -> bool:
    """Whether two versions of a schedule have the same slots and the same idempotency keys."""
    return (a.spec, a.timezone, a.anchor, a.name) == (b.spec, b.timezone, b.anchor, b.name)


def lookback_floor(config: PeriodicTaskConfig, now: datetime) -> datetime | None:
    """The instant a look back (takeover, catch-up) must stay strictly after, or None for none.

    The schedule's ``effective_at``, capped at ``now``: a value in the future (another clock, or a
    hand-written row) only means nothing in the past may be sent.
    """
    floor = config.effective_at
    if floor is None:
        return None
    return floor if floor < now else now


def _later(instant: datetime, seconds: float) -> datetime:
    """``instant + seconds``, saturating at the last representable instant."""
    step = timedelta(seconds=seconds)
    return instant + step if _LATEST - instant > step else _LATEST
