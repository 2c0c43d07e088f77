"""The scheduler: entries in a time-ordered heap, one timing loop, one batch per instant.

Slot semantics (docs/architecture.md, "What is guaranteed"):

* an entry's first slot is the first one strictly after it was registered (nothing fires at start);
* a due slot is enqueued when it is at most ``grace`` late; older slots are skipped (logged and
  counted) and never replayed: after a skip the entry jumps to the first slot after ``now - grace``,
  so a clock jumping forward never causes a storm;
* fire decisions use the clock's ``now``, re-read after every wake; a slot is never enqueued twice by
  one scheduler, even when the clock steps back or an entry is replaced (the last fired slot is kept
  per schedule key and new entries start after it);
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
from datetime import datetime, timedelta
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
    next_slot: datetime
    prev_slot: datetime | None = None
    last_error: str | None = None
    version: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    key: str = ""  # the config's key, cached: read several times per slot
    window: timedelta = timedelta(0)  # how long after a slot it may still be sent
    payload_json: str = "null"  # canonical JSON, computed once per entry, not once per slot
    options_json: str = "{}"


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

    # -- entries -----------------------------------------------------------------------------

    def register(self, config: PeriodicTaskConfig, *, digest: str | None = None) -> ScheduledEntry:
        """Add (or replace, same entry id) an entry; its first slot is strictly after now."""
        digest = digest or content_hash(config)
        eid = entry_id(config, digest)
        now = self.clock.now()
        schedule = config.schedule
        start = max(now, self._last_fired.get(config.key, now))
        entry = ScheduledEntry(
            entry_id=eid,
            config=config,
            schedule=schedule,
            content_hash=digest,
            registered_at=now,
            next_slot=schedule.next_after(start),
            prev_slot=self._last_fired.get(config.key),
            # Versions are globally unique so a stale heap item can never match a re-created entry.
            version=next(self._seq),
            key=config.key,
            payload_json=config.payload_json,
            options_json=config.options_json,
        )
        entry.window = self._window(config)
        self._entries[eid] = entry
        heapq.heappush(self._heap, (entry.next_slot, entry.version, eid))
        self._wake.set()
        return entry

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
        self._heap.clear()
        for entry in self._entries.values():
            last = self._last_fired.get(entry.key)
            start = max(after, last) if last is not None else after
            entry.next_slot = entry.schedule.next_after(start)
            entry.version = next(self._seq)
            self._heap.append((entry.next_slot, entry.version, entry.entry_id))
        heapq.heapify(self._heap)

    async def wait_processed(self, instant: datetime) -> None:
        """Wait until every slot due at or before ``instant`` has been handled (for tests)."""

        def done() -> bool:
            if self._pending_runs or self._writing:
                return False
            if self._processed_until is not None and self._processed_until >= instant:
                return True
            return self._sleeping_until is not None and self._sleeping_until > instant

        async with self._state:
            await self._state.wait_for(done)

    async def _mark_processed(self, now: datetime) -> None:
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
            self._sleeping_until = next_slot or now + timedelta(seconds=delay)
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
        try:
            await self._dispatch(due, now)
        finally:
            self._idle.set()

    async def _dispatch(self, due: list[ScheduledEntry], now: datetime) -> None:
        batches: dict[datetime, list[ScheduledEntry]] = {}
        skipped: list[RunRecord] = []
        for entry in due:
            slot = entry.next_slot
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
        entry.next_slot = entry.schedule.next_after(after)
        entry.version = next(self._seq)
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
        if opts.get("misfire") == "fire_once":
            return max(self.grace, timedelta(seconds=opts.get("catchup_window", self.catchup_window.total_seconds())))
        return self.grace

    def _task(self, entry: ScheduledEntry, slot: datetime, text: str) -> Task:
        return task_for(entry.config, f"{entry.config.name}:{text}", slot, slot + entry.window)

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
            try:
                results = await self.target.enqueue([tasks[i] for i in todo], self.clock.now())
            except Exception as exc:
                error = exc
            else:
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
            if self._stopping or not self._active or self.clock.now() + timedelta(seconds=delay) > deadline:
                if error is not None and all(r is None for r in final):
                    raise error
                for i in todo:
                    if error is not None:
                        final[i] = EnqueueResult(tasks[i], "failed", None, error=str(error))
                return [r for r in final if r is not None]
            await self._backoff(delay)

    async def _backoff(self, delay: float) -> None:
        """Sleep ``delay`` on the clock, cut short by :meth:`stop`."""
        async with self._state:
            self._sleeping_until = self.clock.now() + timedelta(seconds=delay)
            self._state.notify_all()
        sleeper = asyncio.ensure_future(self.clock.sleep(delay))
        stopper = asyncio.ensure_future(self._stop_event.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (sleeper, stopper):
                fut.cancel()
            await asyncio.gather(sleeper, stopper, return_exceptions=True)
            self._sleeping_until = None

    async def _safe_hook(self, hook: Callable[..., Any] | None, *args: Any) -> None:
        try:
            await _call(hook, *args)
        except Exception:  # a user hook must not stop the schedule
            log.exception("hook %r failed", hook)

    async def _report(self, runs: Sequence[RunRecord]) -> None:
        """Hand runs to the writer: recording never delays the next dispatch."""
        if self.on_runs is not None and runs:
            self._pending_runs.extend(runs)
            self._runs_ready.set()

    async def _write_runs(self) -> None:
        """Record pending runs as they come, coalescing batches that arrive while writing."""
        while True:
            await self._runs_ready.wait()
            # Dispatch first: a burst's CPU goes to sending; its records follow right after.
            await self._idle.wait()
            self._runs_ready.clear()
            await self._flush_runs()
            if self._stopping and not self._pending_runs:
                return

    async def _flush_runs(self) -> None:
        if not self._pending_runs or self.on_runs is None:
            return
        runs, self._pending_runs = self._pending_runs, []
        self._writing = True
        try:
            await self.on_runs(runs)
        except Exception:  # the store being down must not stop the schedule
            log.exception("recording %d run(s) failed", len(runs))
        finally:
            self._writing = False
            async with self._state:
                self._state.notify_all()
