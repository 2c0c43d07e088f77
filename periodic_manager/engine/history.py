"""Run history: the outcome of every slot, recorded off the dispatch path.

The scheduler reports runs as they happen (:meth:`RunWriter.report`): metrics see them at once,
and the store gets them in batches from a writer task that waits while a dispatch is under way
(a burst's CPU goes to sending), however many one instant sends. While the store fails (a
database outage), runs wait in memory, at most ``MAX_PENDING_RUNS`` (the oldest are dropped
beyond), and are retried with backoff: one
log line when the outage starts, one when history is written again, with how many runs were
written late and how many were dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import datetime

from periodic_manager import gcpolicy
from periodic_manager.contracts import SENT, RunRecord
from periodic_manager.errors import cause

log = logging.getLogger(__name__)

RunsHook = Callable[[Sequence[RunRecord]], Awaitable[None]]
Observer = Callable[[Sequence[RunRecord]], None]
Sleeper = Callable[[float], Awaitable[None]]

MAX_PENDING_RUNS = 100_000
# A write of at least this many runs ends a burst: then the memory it used is given back.
RELEASE_AFTER_RUNS = 1000
RETRY_MAX_S = 30.0


class RunWriter:
    """Buffers reported runs and hands them to ``store`` in batches, in order."""

    def __init__(
        self,
        store: RunsHook | None,
        *,
        observe: Observer | None = None,
        retry_base: float = 0.2,
        changed: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.observe = observe
        self.retry_base = retry_base
        self._changed = changed  # awaited after every write attempt (wait_processed listens)
        self.pending: list[RunRecord] = []
        self.ready = asyncio.Event()
        self.writing = False
        self.failing: str | None = None  # the store's error while history cannot be written
        self._dropped = 0  # runs dropped in this outage (the buffer was full)
        self._late = 0  # runs written late after this outage
        # options.max_runs: schedule key -> its latest sent run not written yet. Such a schedule
        # sends its next slot only once it is written (see unrecorded_of): a manager that dies
        # has at most one sent run of it unrecorded, which the next one counts as used.
        self.unrecorded: dict[str, datetime] = {}
        self._written = asyncio.Event()

    def report(self, runs: Sequence[RunRecord]) -> None:
        """Count ``runs`` now and queue them for the store; never blocks, never raises."""
        if not runs:
            return
        if self.observe is not None:
            try:
                self.observe(runs)
            except Exception:  # metrics must not stop the schedule
                log.exception("observing %d run(s) failed", len(runs))
        if self.store is not None:
            for run in runs:
                if run.limited and run.status in SENT:
                    self.unrecorded[run.schedule_key] = run.slot
            self.pending.extend(runs)
            if self.failing is not None:
                # Bounded only while the store fails: a healthy store takes a burst of any size
                # (every run of a 400,000-task instant is its settled slot for a takeover).
                self._trim()
            self.ready.set()

    @property
    def settled(self) -> bool:
        """Nothing being written, and nothing waiting but what waits for a store that is down."""
        return not self.writing and (not self.pending or self.failing is not None)

    def _trim(self) -> None:
        excess = len(self.pending) - MAX_PENDING_RUNS
        if excess > 0:  # the store has been down for long: the oldest history goes first
            del self.pending[:excess]
            self._dropped += excess

    async def run(
        self, idle: asyncio.Event, stopping: Callable[[], bool], backoff: Sleeper
    ) -> None:
        """Write pending runs as they come (coalescing batches that arrive meanwhile), after
        ``idle`` is set; returns once ``stopping()`` and nothing more can be written."""
        delay = self.retry_base
        while True:
            await self.ready.wait()
            await idle.wait()
            self.ready.clear()
            size = len(self.pending)
            ok = await self.flush()
            if ok and size >= RELEASE_AFTER_RUNS and not self.pending:
                # A burst is over once its history is written: what it built and freed (tasks,
                # messages, script arguments, results, these rows) goes back to the system.
                gcpolicy.release()
            if stopping() and (ok or not self.pending):
                return
            if ok:
                delay = self.retry_base
                continue
            if stopping():
                log.warning(
                    "stopping with %d run(s) of history not recorded (store: %s)",
                    len(self.pending),
                    self.failing,
                )
                return
            await backoff(delay)
            delay = min(RETRY_MAX_S, delay * 2)
            self.ready.set()

    async def unrecorded_of(self, keys: Collection[str]) -> set[str]:
        """Those of ``keys`` whose latest sent limited run is still not written, after the write
        under way (if any) and one more write of what is pending: normally none."""
        while self.writing:
            self._written.clear()
            await self._written.wait()
        if any(k in self.unrecorded for k in keys):
            await self.flush()
        return {k for k in keys if k in self.unrecorded}

    async def flush(self) -> bool:
        """One write of everything pending; False when the store failed (runs kept)."""
        if not self.pending or self.store is None:
            return True
        runs, self.pending = self.pending, []
        self.writing = True
        try:
            await self.store(runs)
        except Exception as exc:  # the store being down must not stop the schedule
            # Back in front of anything newer, so history is written in order once it can be.
            self.pending[:0] = runs
            self._trim()
            if self.failing is None:
                log.error(
                    "recording run history failed; keeping up to %d run(s) in memory and "
                    "retrying: %s",
                    MAX_PENDING_RUNS,
                    cause(exc),
                )
            self.failing = cause(exc)
            return False
        else:
            if self.unrecorded:
                for run in runs:
                    if run.limited and self.unrecorded.get(run.schedule_key) == run.slot:
                        del self.unrecorded[run.schedule_key]
            if self.failing is not None:
                self._late += len(runs)
                log.warning(
                    "run history recorded again: %d run(s) written late, %d dropped while the "
                    "store was unreachable",
                    self._late,
                    self._dropped,
                )
                self.failing = None
                self._late = self._dropped = 0
            return True
        finally:
            self.writing = False
            self._written.set()
            if self._changed is not None:
                await self._changed()
