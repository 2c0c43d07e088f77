"""PeriodicTaskManager: a provider's schedules in a scheduler, kept in sync, led, and published.

A manager is built whole from its parts, each with one job:

* :class:`~periodic_manager.engine.scheduler.Scheduler`: the entries, their slots, the sending;
* :class:`~periodic_manager.runtime.sync.Syncer`: reads the provider (first before the scheduler
  starts, so the database's schedule is live at once) and keeps the entries equal to the rows;
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
import os
import socket
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from periodic_manager.clock import SystemClock
from periodic_manager.contracts import (
    BeatCarrier,
    BeatStore,
    ChangeSignal,
    Clock,
    ConfigProvider,
    EntryRecord,
    FailureSignal,
    FailureStore,
    Forgetful,
    IncrementalProvider,
    LastGoodStore,
    Leadership,
    ManagerStatus,
    PartitionedProvider,
    PartitionLeadership,
    Pauser,
    RunRecord,
    RuntimeStore,
    ServerClock,
    Target,
    failure_off,
)
from periodic_manager.engine.dispatch import Hooks
from periodic_manager.engine.entry import ScheduledEntry
from periodic_manager.engine.overlap import View
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.errors import ConfigError, NotFoundError
from periodic_manager.providers import StaticProvider
from periodic_manager.runtime.clock_offset import ClockOffset, ClockWatch, DatabaseTime, Remeasuring
from periodic_manager.runtime.failures import FailureWatch
from periodic_manager.runtime.heartbeat import Heartbeat
from periodic_manager.runtime.holding import PartitionHolding
from periodic_manager.runtime.last_good import LastGoodKeeper
from periodic_manager.runtime.leadership import AlwaysLeader, SessionLockLeadership
from periodic_manager.runtime.leading import Leading
from periodic_manager.runtime.memory_store import MemoryRuntimeStore
from periodic_manager.runtime.metrics import ManagerMetrics
from periodic_manager.runtime.publishing import EntryPublisher, entry_record
from periodic_manager.runtime.sync import Reconciler, Syncer, SyncReport
from periodic_manager.runtime.target_health import Gated, TargetHealth
from periodic_manager.runtime.tasks import Supervisor
from periodic_manager.runtime.timing import Timing
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.rules import NO_FAILURE, failure_refusal

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

__all__ = ["PeriodicTaskManager", "SyncReport", "Timing", "new_manager_id"]

# A dispatch silent for this long is stuck: every target call is bounded far below it.
HUNG_AFTER_S = 120.0
# A start waits this long at most for the rows of the partitions its first round took.
FIRST_TAKEOVER_BOUND_S = 120.0


def new_manager_id() -> str:
    """A manager id unique among the managers of a database: host, pid and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class PeriodicTaskManager:
    """Keeps one scheduler entry per schedule of ``provider`` and enqueues due slots to ``target``.

    ``store``: where the manager publishes itself, its entries and what happened to every slot
    (default: in memory); ``leadership``: whether this manager may send (default: always);
    ``signals``: what wakes a sync when schedules change; ``hooks``: code of your own around
    every batch sent; ``close_target``: close the target on :meth:`stop`; ``pauser``: how the
    manager pauses a schedule whose ``options.pause_after_failures`` is reached (the database's:
    ``db.schedule_writer.ManagerPauser``; without one, or without a store that counts failures,
    nothing is counted). ``measure_clock``: measure the clock against the database's
    (``runtime.clock_offset``; default: when ``clock`` is the system's, the wall clock).
    """

    def __init__(
        self,
        provider: ConfigProvider | None,
        target: Target,
        *,
        clock: Clock | None = None,
        store: RuntimeStore | None = None,
        leadership: Leadership | None = None,
        signals: Sequence[ChangeSignal] = (),
        timing: Timing = Timing(),  # noqa: B008 - frozen
        hooks: Hooks | None = None,
        manager_id: str | None = None,
        close_target: bool = False,
        pauser: Pauser | None = None,
        measure_clock: bool | None = None,
    ) -> None:
        self.provider: ConfigProvider = provider or StaticProvider()
        self.target = target
        self.store: RuntimeStore = store or MemoryRuntimeStore()
        # This wall clock against the database's (at start, every lease round or heartbeat, and
        # before the next send after a jump): slots are judged on the wall clock corrected by
        # the offset measured, and beyond grace / 4 nothing is held or sent.
        raw = clock or SystemClock()
        self.clock_offset = ClockOffset(
            raw,
            limit=timing.grace / 4,
            read=self.store.server_now if isinstance(self.store, ServerClock) else None,
        )
        if measure_clock is None:
            measure_clock = isinstance(raw, SystemClock)  # a virtual one agrees with nobody
        self.clock: Clock = DatabaseTime(raw, self.clock_offset) if measure_clock else raw
        self.leadership: Leadership = leadership or AlwaysLeader()
        self.signals = list(signals)
        self.timing = timing
        self.manager_id = manager_id or new_manager_id()
        self._close_target = close_target
        self.signals_ignored = 0  # change signals naming only partitions not held (no sync)
        self._running = False
        self.started_at: datetime | None = None
        # Set once start() has said "started": the publisher waits for it (a cold start's
        # entries are published after the start, never in the middle of it).
        self._up = asyncio.Event()
        self._sent = asyncio.Event()  # a batch of runs since the broker watch last looked
        self.tasks = Supervisor(lambda: self._running)
        self.publisher = EntryPublisher(
            self.store,
            self.manager_id,
            on_failure=self._store_failed,
            quiet=self._quiet,
            between=self._between,
            views=self._view,
        )
        self.scheduler = Scheduler(
            target,
            clock=self.clock,
            grace=timing.grace,
            catchup_window=timing.catchup_window,
            catchup_rate=timing.catchup_rate,
            hooks=hooks,
            on_runs=self.store.record_runs,
            observe=self._observe_runs,
            view_changed=self.publisher.upsert,
            read_state=self.store.get_state,
        )
        # Nothing is sent until leadership is decided (at once for AlwaysLeader).
        self.scheduler.set_active(False)
        incremental = self.provider if isinstance(self.provider, IncrementalProvider) else None
        if incremental is not None:
            # Rows are built as entries (adopted without a copy); unchanged ones are reused.
            incremental.adopt(ScheduledEntry, self._known_config)
        self.metrics = ManagerMetrics(self)  # its own registry: served by /metrics or a port
        keeper = LastGoodKeeper(
            self.scheduler,
            self.publisher,
            self.manager_id,
            store=self.store if isinstance(self.store, LastGoodStore) else None,
            judge=incremental.judge_stored if incremental is not None else None,
            read_state=self.store.get_state,
        )
        self.syncer = Syncer(
            self.provider,
            Reconciler(self.scheduler, self.publisher, keeper, self.store.get_state),
            clock=self.clock,
            timing=timing,
            metrics=self.metrics,
            prune=self.publisher.call,
        )
        self.heartbeat = Heartbeat(
            self.store,
            self.manager_id,
            status=self._status,
            records=self._records,
            clock=self.clock,
            interval=timing.heartbeat_interval,
            metrics=self.metrics,
        )
        # Partition leases, or None: probed once here (a Protocol's isinstance walks its members,
        # too slow for the properties the heartbeat reads at every lease round).
        self.leases: PartitionLeadership | None = (
            self.leadership if isinstance(self.leadership, PartitionLeadership) else None
        )
        partitioned = self.leases is not None
        self.leading = Leading(
            self.scheduler,
            self.store,
            self.leadership,
            clock=self.clock,
            manager_id=self.manager_id,
            spawn=self.tasks.spawn,
            running=lambda: self._running,
            changed=self.heartbeat.now.set,
            partitioned=partitioned,
        )
        # options.pause_after_failures: counted where the store can, paused through the pauser.
        self.failures: FailureWatch | None = None
        if (
            pauser is not None
            and isinstance(self.store, FailureStore)
            and isinstance(target, FailureSignal)
        ):
            self.failures = FailureWatch(
                self.scheduler,
                self.store,
                target,
                pauser,
                clock=self.clock,
                manager_id=self.manager_id,
                interval=timing.heartbeat_interval,
                paused=self.request_sync,
            )
        # By partitions: entries only for the partitions held, each taken over on its own.
        self.holding: PartitionHolding | None = None
        if self.leases is not None:
            if not isinstance(self.provider, PartitionedProvider):
                raise ValueError(
                    "partition leases need a provider that reads by partition (the database's)"
                )
            self.holding = PartitionHolding(
                self.leases,
                self.provider,
                self.syncer,
                self.leading,
                spawn=self.tasks.spawn,
                changed=self.heartbeat.now.set,
            )
            self.leases.attach(self.holding)
        # A manager that shares the work holds it only while its targets answer their pings.
        self.target_health: TargetHealth | None = None
        if isinstance(self.leadership, Gated):
            self.target_health = TargetHealth(
                target,
                clock=self.clock,
                interval_s=timing.target_ping_interval,
                failures=timing.target_ping_failures,
                changed=self._target_health_changed,
            )
            self.leadership.gate(self.target_health.may_hold)
        # The lease rounds write the heartbeat in their own statement (one round trip per round
        # at rest, none for the heartbeat) when they reach the store's database and come at
        # least as often as the heartbeats must.
        if (
            isinstance(self.leadership, BeatCarrier)
            and isinstance(self.store, BeatStore)
            and self.store.carries_beat
            and self.leadership.interval <= timing.heartbeat_interval
        ):
            self.heartbeat.carried_by(self.leadership)
        rounds = None
        if measure_clock and isinstance(self.leadership, Remeasuring):
            self.leadership.offset = self.clock_offset
            rounds = self.leadership.round  # they measure (and hand over when it is off)
        self.clock_watch = ClockWatch(self.clock_offset, rounds)
        if measure_clock:
            if isinstance(self.leadership, SessionLockLeadership):  # leader mode: steps down
                self.leadership.may_lead = lambda: self.clock_offset.agrees
                self.clock_watch.step_down = self.leadership.step_down
            if rounds is None:
                self.heartbeat.measure = self.clock_watch.measure
            self.scheduler.on_tick = self.clock_watch.tick

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
            log.warning("could not unpublish manager %s: %s", self.manager_id, exc)
        if self._close_target:
            await self.target.close()
        log.info("manager %s stopped", self.manager_id)

    @property
    def failed(self) -> BaseException | None:
        """The error of the first supervised loop that died (None while all run)."""
        return self.tasks.failed

    def health(self) -> str | None:
        """None while every loop runs; otherwise why this manager is not healthy (one line)."""
        if self.tasks.failed is not None:
            failed = self.tasks.failed
            return f"{self.tasks.failed_task} died: {type(failed).__name__}: {failed}"
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
    def is_leader(self) -> bool:
        return self.leadership.is_leader

    @property
    def standing_down(self) -> str | None:
        """Why this manager holds no work while its targets do not answer (None: it may hold
        work; see :mod:`~periodic_manager.runtime.target_health`)."""
        return self.target_health.reason if self.target_health is not None else None

    @property
    def stand_downs(self) -> int:
        """Times this manager stood down because its targets did not answer."""
        return self.target_health.stand_downs if self.target_health is not None else 0

    @property
    def partitions(self) -> frozenset[int]:
        """The partitions this manager holds (none unless it leases partitions)."""
        return self.leases.held if self.leases is not None else frozenset()

    @property
    def does_shared_work(self) -> bool:
        """Whether this manager does the work done once for all (pruning tombstones, run
        history by age, the change history): by partitions, the holder of partition 0 alone."""
        return self.leases.trusted(0) if self.leases is not None else True

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

    # -- what the parts ask of each other ----------------------------------------------------

    def _known_config(self, row_id: int) -> PeriodicTaskConfig | None:
        entry = self.scheduler.get(row_id)
        return entry if entry is not None and entry.synced else None

    def _store_failed(self, exc: BaseException) -> None:
        self.heartbeat.store_failed(exc)  # republish this manager and its entries next beat

    async def _quiet(self) -> None:
        # A cold start registers first, then publishes: not while start() still awaits the
        # leadership or the change signals (the publisher's slices would delay "started").
        await self._up.wait()
        await self.syncer.quiet()

    async def _between(self) -> None:
        await self.scheduler.wait_idle()  # a slot due meanwhile goes before the next slice

    def _view(self, ident: int | str) -> View | None:
        return self.scheduler.overlap.view(ident)

    def _target_health_changed(self, may_hold: bool) -> None:
        if isinstance(self.leadership, Gated):
            self.leadership.wake()  # hand over (or take a share) now, not at the next round
        self.heartbeat.now.set()  # the managers page says so at once

    def _observe_runs(self, runs: Sequence[RunRecord]) -> None:
        self.metrics.observe_runs(runs)
        self._sent.set()  # the broker watch looks at its next tick

    def _status(self) -> ManagerStatus:
        return ManagerStatus(
            heartbeat_at=self.clock.now(),
            is_leader=self.is_leader,
            last_sync_at=self.syncer.last_sync_at,
            last_sync_error=self.syncer.last_sync_error,
            entry_count=len(self.scheduler),
            shared_work=self.does_shared_work,
            target_down=self.standing_down,
            clock_offset_s=self.clock_offset.offset,
        )

    def _records(self) -> list[EntryRecord]:
        view = self.scheduler.overlap.view
        records = [entry_record(e, view(e.ident)) for e in self.scheduler.entries()]
        return records + [bad.record for bad in self.syncer.reconciler.row_errors.values()]
