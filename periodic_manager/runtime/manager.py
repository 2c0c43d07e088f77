"""PeriodicTaskManager: a provider's schedules in a scheduler, kept in sync, led, and published.

A manager is built whole from its parts (built and wired by
:class:`~periodic_manager.runtime.manager_parts.ManagerParts`, its base), each with one job:

* :class:`~periodic_manager.engine.scheduler.Scheduler`: the entries, their slots, the sending;
* :class:`~periodic_manager.runtime.sync.Syncer`: reads the provider (first before the scheduler
  starts, so the database's schedule is live at once), and its
  :class:`~periodic_manager.runtime.reconcile.Reconciler` keeps the entries equal to the rows;
* :class:`~periodic_manager.runtime.leading.Leading`: what a change of leadership does (a
  takeover starts after what the store records as settled);
* :class:`~periodic_manager.runtime.heartbeat.Heartbeat`: this manager in the runtime store;
* :class:`~periodic_manager.runtime.publishing.EntryPublisher`: its entries there, for the API;
* :class:`~periodic_manager.runtime.tasks.Supervisor`: every loop watched; one that dies makes
  the manager unhealthy, loudly.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import TYPE_CHECKING

from periodic_manager.contracts import Forgetful, WorksBeside, failure_off
from periodic_manager.engine.entry import ScheduledEntry
from periodic_manager.errors import ConfigError, NotFoundError, cause
from periodic_manager.runtime.manager_parts import ManagerParts, new_manager_id
from periodic_manager.runtime.reconcile import SyncReport
from periodic_manager.runtime.timing import Timing
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.rules import NO_FAILURE, failure_refusal
from periodic_manager.targets.routing import RoutingTarget

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

__all__ = ["PeriodicTaskManager", "SyncReport", "Timing", "new_manager_id"]

# A dispatch silent for this long is stuck: every target call is bounded far below it.
HUNG_AFTER_S = 120.0
# A start waits this long at most for the rows of the partitions its first round took.
FIRST_TAKEOVER_BOUND_S = 120.0


class PeriodicTaskManager(ManagerParts):
    """Keeps one scheduler entry per schedule of ``provider`` and enqueues due slots to ``target``.

    ``store``: where the manager publishes itself, its entries and what happened to every slot
    (default: in memory); ``leadership``: whether this manager may send (default: always);
    ``signals``: what wakes a sync when schedules change; ``hooks``: code of your own around
    every batch sent; ``close_target``: close the target on :meth:`stop`; ``pauser``: how the
    manager pauses a schedule whose ``options.pause_after_failures`` is reached (the database's:
    ``db.schedule_writer.ManagerPauser``; without one, or without a store that counts failures,
    nothing is counted). ``measure_clock``: measure the clock against the database's
    (``runtime.clock_offset``; default: when ``clock`` is the system's, the wall clock).
    ``tracing``: trace every batch sent (``PM_OTEL``; its spans are flushed on :meth:`stop`).
    """

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Publish this manager, run the first sync, then start the loops."""
        if self.scheduler.on_tick is not None:
            await self.clock_watch.measure(direct=True)  # started_at on the database's time
        self.started_at = self.clock.now()
        await self.heartbeat.register(self.started_at)
        self.tasks.spawn(self.publisher.run(), "publisher")
        await self.syncer.sync()
        await self.leadership.start(self.leading.changed)
        self.tasks.watch(self.leadership.task)
        if self.holding is not None:
            # The partitions of the first round are read before "started with N entries", so a
            # lone manager says it with every schedule registered, as a leader does.
            await self.holding.taken(FIRST_TAKEOVER_BOUND_S)
        for signal in self.signals:
            await signal.start(self.signalled)
            self.tasks.watch(signal.task)
        self._running = True
        self.tasks.spawn(self.scheduler.run(), "scheduler")
        # Edits come by signal: the loop is a safety net.
        self.tasks.spawn(self.syncer.run(on_ticks=bool(self.signals)), "sync-loop")
        self.tasks.spawn(self.heartbeat.run(), "heartbeat")
        if isinstance(self.target, Forgetful):
            self.tasks.spawn(self.heartbeat.watch(self.target, self._sent), "broker-watch")
        if self.failures is not None:
            self.tasks.spawn(self.failures.run(), "failure-watch")
        if self.announcer is not None:
            self.tasks.spawn(self.announcer.run(), "entry-announcer")
        if isinstance(self.target, WorksBeside):
            self.tasks.spawn(self.target.run_beside(self.clock, self.manager_id), "target-work")
        if self.target_health is not None and self.target_health.targets:
            self.tasks.spawn(self.target_health.run(), "target-pings")
        log.info(
            "manager %s started with %d entries (%s)",
            self.manager_id,
            len(self.scheduler),
            "leader" if self.is_leader else "standby",
        )
        self._up.set()

    async def stop(self) -> None:
        """Stop the loops (an enqueue under way finishes first) and unpublish this manager."""
        self._running = False
        self._up.clear()
        self.scheduler.stop()
        for signal in self.signals:
            await signal.stop()
        await self.tasks.stop(keep="scheduler")
        # Nothing is sent any more: leadership goes next, before the last calls to the store
        # (unregistering removes a large start's entries). Its checks (or lease renewals) must
        # not run on while the rest of the stop takes its time: one failing then said "lost
        # leadership" at ERROR (or a lease "not renewed in time") on a clean stop.
        await self.leadership.stop()
        await self.publisher.discard()  # unregistering removes every entry published
        try:
            await self.store.unregister_manager(self.manager_id)
        except Exception as exc:
            log.warning("could not unpublish manager %s: %s", self.manager_id, cause(exc))
        if self.announcer is not None:
            await self.announcer.withdraw()
        if self._close_target:
            await self.target.close()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.flush)
        log.info("manager %s stopped", self.manager_id)

    @property
    def failed(self) -> BaseException | None:
        """The error of the first supervised loop that died (None while all run)."""
        return self.tasks.failed

    def health(self) -> str | None:
        """None while every loop runs; otherwise why this manager is not healthy (one line)."""
        if self.tasks.failed is not None:
            failed = self.tasks.failed
            return f"{self.tasks.failed_task} died: {cause(failed)}"
        hung = self.scheduler.hung_for(self.clock.now())
        if hung > HUNG_AFTER_S:
            return f"dispatch has shown no progress for {hung:.0f} s (a target call that never returns)"
        return self.leading.stalled(self.clock.now())

    def clock_check(self) -> str:
        return self.clock_offset.check() if self.scheduler.on_tick is not None else "ok"

    @property
    def clock_offset_s(self) -> float | None:
        """Seconds this wall clock is ahead of the database's, as last measured (None: not)."""
        return self.clock_offset.offset

    @property
    def default_target(self) -> str:
        """The target of the schedules without ``options.target`` (the metrics' ``target``)."""
        target = self.target
        return target.default if isinstance(target, RoutingTarget) else target.name

    @property
    def stand_downs(self) -> int:
        """Times this manager stood down because its targets did not answer."""
        return self.target_health.stand_downs if self.target_health is not None else 0

    @property
    def partitions(self) -> frozenset[int]:
        """The partitions this manager holds (none unless it leases partitions)."""
        return self.leases.held if self.leases is not None else frozenset()

    @property
    def partition_handovers(self) -> int:
        """Partitions this manager has handed over cleanly so far."""
        return self.leases.handovers if self.leases is not None else 0

    @property
    def registry(self) -> CollectorRegistry:
        """This manager's Prometheus metrics (``/metrics``, or the CLI's metrics port)."""
        return self.metrics.registry

    # -- syncs -------------------------------------------------------------------------------

    def request_sync(self) -> None:
        """Ask for a sync as soon as possible (non-blocking; bursts coalesce into one sync)."""
        self.syncer.request()

    def signalled(self, partitions: frozenset[int] | None) -> None:
        """A change signal: sync, unless it names only partitions this manager does not hold
        (``PM_COORDINATION=partitions``: another manager's rows changed). None: any may have."""
        if (
            partitions is not None
            and self.holding is not None
            and not partitions & self.holding.mine
        ):
            self.signals_ignored += 1
            return
        self.syncer.request()

    async def sync(self, *, full: bool = False) -> SyncReport:
        """Reconcile the entries with the provider now (see :class:`Syncer`)."""
        return await self.syncer.sync(full=full)

    @property
    def last_sync_at(self) -> datetime | None:
        return self.syncer.last_sync_at

    @property
    def last_sync_error(self) -> str | None:
        return self.syncer.last_sync_error

    # -- code API ----------------------------------------------------------------------------

    def register(self, config: PeriodicTaskConfig) -> ScheduledEntry:
        """Register a schedule from code (kept across syncs until :meth:`unregister`).

        Raises ConfigError (``options.overlap``) when the schedule asks for skip or hold and its
        target cannot tell when a task finished, or (``options.pause_after_failures``) when it
        asks to pause on failure and its target cannot tell a failed task."""
        why = failure_off(self.target, config.options)
        if why is not None:
            raise ConfigError(
                "options.pause_after_failures",
                failure_refusal(self.target.name, why),
                code=NO_FAILURE,
            )
        why = self.target.completion_off(config.options)
        if why is not None:
            raise ConfigError(
                "options.overlap",
                f"{config.options.get('overlap')!r} needs to know when the previous task has "
                f"finished, and the target cannot tell: {why}",
                code="no-completion-signal",
            )
        old = self.scheduler.get(config.key)
        entry = self.scheduler.register(config)
        if old is not None and old.entry_id != entry.entry_id:
            self.publisher.remove(old.entry_id)
        self.publisher.upsert(entry)
        return entry

    def unregister(self, name_or_key: str) -> None:
        """Remove a schedule registered from code, by name or key."""
        for key in (name_or_key, f"name:{name_or_key}"):
            entry = self.scheduler.get(key)
            if entry is not None and not entry.synced:
                self.scheduler.unregister(key)
                self.publisher.remove(entry.entry_id)
                return
        raise NotFoundError(name_or_key)

    def entries(self) -> list[ScheduledEntry]:
        return self.scheduler.entries()

    def entry(self, key: int | str) -> ScheduledEntry | None:
        """The entry of schedule ``key`` (a row id, or ``name:<name>`` for code), if registered."""
        return self.scheduler.get(key)

    # -- waiting (tests, benchmarks) ---------------------------------------------------------

    async def wait_settled(self, instant: datetime) -> None:
        """Wait until slots due by ``instant`` are handled, no takeover is reading and no sync
        is running (for tests)."""
        await self.leading.settled()
        await self.scheduler.wait_processed(instant)
        async with self.syncer.lock, self.heartbeat.lock:
            pass
        await self.flush()

    async def flush(self) -> None:
        """Wait until every entry change so far is published to the store."""
        await self.publisher.flush()
