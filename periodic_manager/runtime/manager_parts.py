"""The parts of a :class:`~periodic_manager.runtime.manager.PeriodicTaskManager` (see that
module for what each does), built and wired to each other once, in steps by concern: the clock
and its offset from the database's, the parts that keep and send the schedules, then those that
share the work with other managers (leadership, partitions, target health, failures). Which
optional parts a manager has is decided here, from the contracts the given objects meet. Also
what the parts ask of each other, and what the heartbeat publishes of them."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import cast

from periodic_manager.clock import SystemClock
from periodic_manager.contracts import (
    BeatCarrier,
    BeatStore,
    ChangeSignal,
    Clock,
    ConfigProvider,
    EntryAnnouncer,
    EntryRecord,
    FailureSignal,
    FailureStore,
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
    SlotTracer,
    Target,
)
from periodic_manager.engine.dispatch import Hooks
from periodic_manager.engine.entry import ScheduledEntry
from periodic_manager.engine.overlap import View
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.providers import StaticProvider
from periodic_manager.runtime.announcing import Announcer
from periodic_manager.runtime.clock_offset import ClockOffset, ClockWatch, DatabaseTime, Remeasuring
from periodic_manager.runtime.failures import FailureWatch
from periodic_manager.runtime.heartbeat import Heartbeat
from periodic_manager.runtime.holding import PartitionHolding
from periodic_manager.runtime.last_good import LastGoodKeeper
from periodic_manager.runtime.leadership import AlwaysLeader, SessionLockLeadership
from periodic_manager.runtime.leading import Leading
from periodic_manager.runtime.memory_store import MemoryRuntimeStore
from periodic_manager.runtime.metrics import ManagerMetrics, ManagerView
from periodic_manager.runtime.publishing import EntryPublisher, entry_record
from periodic_manager.runtime.reconcile import Reconciler
from periodic_manager.runtime.sync import Syncer
from periodic_manager.runtime.target_health import Gated, TargetHealth
from periodic_manager.runtime.tasks import Supervisor
from periodic_manager.runtime.timing import Timing
from periodic_manager.schedules.definition import PeriodicTaskConfig


def new_manager_id() -> str:
    """A manager id unique among the managers of a database: host, pid and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class ManagerParts:
    """A manager's parts, wired; its constructor is the manager's (documented there)."""

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
        metrics_schedules: int = 100,
        tracing: SlotTracer | None = None,
    ) -> None:
        self.provider: ConfigProvider = provider or StaticProvider()
        self.target = target
        self.store: RuntimeStore = store or MemoryRuntimeStore()
        measure = self._build_clock(clock, timing, measure_clock)
        self.leadership: Leadership = leadership or AlwaysLeader()
        self.signals = list(signals)
        self.timing = timing
        self.metrics_schedules = metrics_schedules
        self.tracing = tracing
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
        self._build_schedules(target, hooks, timing)
        self._build_sharing(timing)
        self._build_watches(target, pauser, timing)
        self._watch_clock(measure)

    def _build_clock(self, clock: Clock | None, timing: Timing, measure: bool | None) -> bool:
        """This wall clock against the database's (at start, every lease round or heartbeat,
        and before the next send after a jump): slots are judged on the wall clock corrected by
        the offset measured, and beyond grace / 4 nothing is held or sent. Whether it is
        measured (default: when ``clock`` is the system's)."""
        raw = clock or SystemClock()
        self.clock_offset = ClockOffset(
            raw,
            limit=timing.grace / 4,
            read=self.store.server_now if isinstance(self.store, ServerClock) else None,
        )
        if measure is None:
            measure = isinstance(raw, SystemClock)  # a virtual one agrees with nobody
        self.clock: Clock = DatabaseTime(raw, self.clock_offset) if measure else raw
        return measure

    def _build_schedules(self, target: Target, hooks: Hooks | None, timing: Timing) -> None:
        """The parts that keep the schedules and send their slots: the scheduler, the syncer
        that keeps its entries equal to the provider's rows, and what they publish."""
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
            tracing=self.tracing,
        )
        # Nothing is sent until leadership is decided (at once for AlwaysLeader).
        self.scheduler.set_active(False)
        incremental = self.provider if isinstance(self.provider, IncrementalProvider) else None
        if incremental is not None:
            # Rows are built as entries (adopted without a copy); unchanged ones are reused.
            incremental.adopt(ScheduledEntry, self._known_config)
        # Its own registry, served by /metrics or a port; read at scrape time from the whole
        # manager (a PeriodicTaskManager: these parts are its own).
        self.metrics = ManagerMetrics(cast(ManagerView, self), schedules=self.metrics_schedules)
        keeper = LastGoodKeeper(
            self.scheduler,
            self.publisher,
            self.manager_id,
            store=self.store if isinstance(self.store, LastGoodStore) else None,
            judge=incremental.judge_stored if incremental is not None else None,
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

    def _build_sharing(self, timing: Timing) -> None:
        """The parts that share the work with other managers: who leads, or which partitions
        are held and what taking or handing one over does."""
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

    def _build_watches(self, target: Target, pauser: Pauser | None, timing: Timing) -> None:
        """What watches the targets: whether they answer (a manager that shares the work holds
        it only while they do), and the failures of their tasks counted for a pause."""
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
                paused=self.syncer.request,
            )
        # A target whose workers' tools list schedules (asynq's scheduler entries) hears of them.
        self.announcer: Announcer | None = None
        if isinstance(target, EntryAnnouncer):
            self.announcer = Announcer(
                target, self.manager_id, self.clock, self.scheduler.held, self._sending
            )

    def _sending(self) -> bool:
        return self.leadership.is_leader

    def _watch_clock(self, measure: bool) -> None:
        """Who measures the clock's offset (the lease rounds, else the heartbeat), and what a
        leader does when it is off."""
        rounds = None
        if measure and isinstance(self.leadership, Remeasuring):
            self.leadership.offset = self.clock_offset
            rounds = self.leadership.round  # they measure (and hand over when it is off)
        self.clock_watch = ClockWatch(self.clock_offset, rounds)
        if measure:
            if isinstance(self.leadership, SessionLockLeadership):  # leader mode: steps down
                self.leadership.may_lead = lambda: self.clock_offset.agrees
                self.clock_watch.step_down = self.leadership.step_down
            if rounds is None:
                self.heartbeat.measure = self.clock_watch.measure
            self.scheduler.on_tick = self.clock_watch.tick

    # -- what the heartbeat publishes --------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.leadership.is_leader

    @property
    def standing_down(self) -> str | None:
        """Why this manager holds no work while its targets do not answer (None: it may hold
        work; see :mod:`~periodic_manager.runtime.target_health`)."""
        return self.target_health.reason if self.target_health is not None else None

    @property
    def does_shared_work(self) -> bool:
        """Whether this manager does the work done once for all (pruning tombstones, run
        history by age, the change history): by partitions, the holder of partition 0 alone."""
        return self.leases.trusted(0) if self.leases is not None else True

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
