"""Syncs: when and how much the manager reads from its provider.

:class:`Syncer` decides when and how much to read: the first sync runs before the scheduler
starts, so the database's schedule is live at once; then a sync every ``sync_interval`` and
whenever one is requested (a change signal, an API edit in the same process). Where a change
signal carries the edits (``on_ticks``: LISTEN, MariaDB/MySQL's poll) that periodic sync is a
safety net and comes on the clock's ticks (:func:`~periodic_manager.clock.next_tick`), in the
wake-ups of the lease rounds at rest; without one it is how plain-SQL edits are seen, and comes
``sync_interval`` after the last sync ended (a steady phase from the start). Only what changed
when the provider can tell (an :class:`~periodic_manager.contracts.IncrementalProvider`), and a
full read at least every ``full_sync_interval`` and after any failed sync, unless the provider
can tell that nothing changed since the last full read (then that one stands). A provider
failure keeps every entry and is retried. What was read is applied by the
:class:`~periodic_manager.runtime.reconcile.Reconciler`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from periodic_manager import gcpolicy
from periodic_manager.clock import next_tick, sleep_unless
from periodic_manager.contracts import Clock, ConfigProvider, DigestingProvider, IncrementalProvider
from periodic_manager.errors import cause
from periodic_manager.runtime.metrics import ManagerMetrics
from periodic_manager.runtime.reconcile import Reconciler, SyncReport
from periodic_manager.runtime.tasks import reraise_if_cancelled
from periodic_manager.runtime.timing import Timing

log = logging.getLogger(__name__)

# Tombstones of deleted rows are kept this long; a full reconcile (at least every
# full_sync_interval, and after any failed sync) covers whatever is pruned.
TOMBSTONE_RETENTION = timedelta(days=1)
# How long the scheduler remembers the last slot of a schedule that was paused or deleted (a
# schedule back within this never resends it, even after the clock stepped back).
RETIRED_MEMORY = timedelta(days=1)
# A sync that registers this many entries freezes the survivors out of the garbage collector.
FREEZE_AFTER = 10_000


def settle_after(registered: int) -> None:
    """After ``registered`` entries came in one go (a sync, a takeover of partitions), done with
    the cyclic collector paused: from ``FREEZE_AFTER`` on, the survivors are frozen (see gcpolicy:
    never walked again) and the garbage given back."""
    if registered >= FREEZE_AFTER:
        gcpolicy.freeze()
        gcpolicy.release()


class Syncer:
    """When and how much to read from the provider (see the module docstring)."""

    def __init__(
        self,
        provider: ConfigProvider,
        reconciler: Reconciler,
        *,
        clock: Clock,
        timing: Timing,
        metrics: ManagerMetrics,
        prune: Callable[[Awaitable[object], str], Awaitable[None]],
    ) -> None:
        self.provider = provider
        self.reconciler = reconciler
        self.scheduler = reconciler.scheduler
        self.clock = clock
        self.interval = timing.sync_interval
        self.full_interval = timedelta(seconds=timing.full_sync_interval)
        self.metrics = metrics
        self._prune = prune  # runs a store call, a failure logged (the publisher's call)
        self.incremental = provider if isinstance(provider, IncrementalProvider) else None
        self.digesting = provider if isinstance(provider, DigestingProvider) else None
        self.requested = asyncio.Event()
        self.lock = asyncio.Lock()  # one sync at a time
        self.last_sync_at: datetime | None = None
        self.last_sync_error: str | None = None
        self._revision: int | None = None
        self._last_full: datetime | None = None

    def request(self) -> None:
        """Ask for a sync as soon as possible (non-blocking; bursts coalesce into one sync)."""
        self.requested.set()

    async def run(self, *, on_ticks: bool = False) -> None:
        """Sync every ``interval`` (and at once when asked). ``on_ticks``: a change signal
        carries the edits, so this loop is a safety net and comes on the clock's ticks."""
        while True:
            if on_ticks:  # a safety net: with the process's other periodic wake-ups
                await sleep_unless(
                    self.clock, self.requested, until=next_tick(self.clock.now(), self.interval)
                )
            else:
                # ``interval`` after the last sync ended: a plain-SQL edit is seen at a steady
                # phase from the start (what docs/operations.md and the tests promise).
                await sleep_unless(self.clock, self.requested, seconds=self.interval)
            self.requested.clear()
            await self.sync()

    async def quiet(self) -> None:
        """Return when no sync is under way."""
        async with self.lock:
            pass

    async def sync(self, *, full: bool = False) -> SyncReport:
        """Reconcile the entries with the provider: only what changed when the provider can tell
        (and a full read at least every ``full_sync_interval``), or everything with ``full``."""
        async with self.lock:
            return await self.sync_held(full=full)

    async def sync_held(self, *, full: bool = False) -> SyncReport:
        """:meth:`sync` for a caller that holds :attr:`lock` (a takeover of every partition
        by a manager holding none: its rows are read and registered by the first sync's path)."""
        assert self.lock.locked(), "sync_held() under the sync lock"
        with self.metrics.time_sync(), gcpolicy.paused():
            report = await self._sync(full=full)
            settle_after(report.added + report.replaced)
            return report

    async def _sync(self, *, full: bool) -> SyncReport:
        now = self.clock.now()
        provider = self.incremental
        try:
            if (
                not full
                and provider is not None
                and self._revision is not None
                and self._last_full is not None
            ):
                if now - self._last_full < self.full_interval:
                    changes = await provider.get_changes(self._revision)
                    if changes is None:
                        return self._finish(SyncReport(ok=True), now)
                    if not changes.full:
                        report = await self.reconciler.apply_changes(changes, now)
                        self._revision = changes.revision
                        return self._finish(report, now)
                elif self.digesting is not None and await self.digesting.unchanged_since_full():
                    # A full reconcile due while nothing changed since the last one: that one
                    # stands (it found what a new one would), and its housekeeping is done.
                    await self.reconciler.reaffirm(self._revision, now)
                    self._last_full = now
                    return await self._after_full(SyncReport(ok=True), now)
            snapshot = await self.provider.get_configs()
        except Exception as exc:
            reraise_if_cancelled(exc)
            msg = cause(exc)
            if msg != self.last_sync_error:
                log.error("sync failed, keeping %d entries: %s", len(self.scheduler), msg)
            self.last_sync_error = msg
            self._last_full = None  # after an outage, reconcile everything once
            return SyncReport(ok=False, error=msg)
        report = await self.reconciler.apply_snapshot(snapshot, now)
        self._revision = snapshot.revision
        self._last_full = now
        return await self._after_full(report, now)

    async def _after_full(self, report: SyncReport, now: datetime) -> SyncReport:
        self.scheduler.forget_retired(now - RETIRED_MEMORY)
        if self.incremental is not None:
            await self._prune(
                self.incremental.prune_tombstones(now - TOMBSTONE_RETENTION), "pruning tombstones"
            )
        return self._finish(report, now)

    def _finish(self, report: SyncReport, now: datetime) -> SyncReport:
        self.reconciler.seen_before = now
        if self.last_sync_error is not None:
            log.info("sync recovered")
        self.last_sync_error = None
        self.last_sync_at = now
        if report.added or report.replaced or report.removed or report.errors:
            log.info(
                "sync: %d added, %d replaced, %d removed, %d unchanged, %d bad rows",
                report.added,
                report.replaced,
                report.removed,
                report.unchanged,
                len(report.errors),
            )
        return report
