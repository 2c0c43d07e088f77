"""PeriodicTaskManager: a provider, a scheduler, a sync loop and a heartbeat.

The first sync runs before the scheduler starts, so the database's schedule is live at once; then
a sync every ``sync_interval`` and whenever :meth:`request_sync` is called (the API does so after
each edit when it runs in the same process). A sync diffs the provider's configs against the
registered entries by content hash: unchanged keeps the entry and its timing, changed replaces it,
gone or disabled removes it. A provider failure keeps every entry and is retried at the next sync.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry

from periodic_manager import __version__
from periodic_manager.clock import SystemClock
from periodic_manager.contracts import (
    ChangeSignal,
    Clock,
    ConfigProvider,
    EntryRecord,
    Forgetful,
    IncrementalProvider,
    LastGoodStore,
    Leadership,
    ManagerInfo,
    ManagerStatus,
    RunRecord,
    RuntimeStore,
    Target,
)
from periodic_manager.engine import catchup
from periodic_manager.engine.scheduler import (
    ErrorHook,
    PostEnqueueHook,
    PreEnqueueHook,
    ScheduledEntry,
    Scheduler,
)
from periodic_manager.errors import ConfigError, NotFoundError
from periodic_manager.providers import StaticProvider
from periodic_manager.runtime import gcpolicy
from periodic_manager.runtime.last_good import LastGoodKeeper
from periodic_manager.runtime.leadership import AlwaysLeader
from periodic_manager.runtime.memory_store import MemoryRuntimeStore
from periodic_manager.runtime.metrics import ManagerMetrics
from periodic_manager.runtime.publishing import EntryPublisher, entry_record
from periodic_manager.runtime.sync import Reconciler, SyncReport
from periodic_manager.schedules.definition import PeriodicTaskConfig, ident_of

log = logging.getLogger(__name__)

__all__ = ["PeriodicTaskManager", "SyncReport"]

# Tombstones of deleted rows are kept this long; a full reconcile (at least every
# full_sync_interval, and after any failed sync) covers whatever is pruned.
TOMBSTONE_RETENTION = timedelta(days=1)
STOP_TIMEOUT_S = 30.0
# How long the scheduler remembers the last slot of a schedule that was paused or deleted (a
# schedule back within this never resends it, even after the clock stepped back).
RETIRED_MEMORY = timedelta(days=1)
# A sync that registers this many entries freezes the survivors out of the garbage collector.
FREEZE_AFTER = 10_000
# A dispatch silent for this long is stuck: every target call is bounded far below it.
HUNG_AFTER_S = 120.0
# Tasks that end by themselves once their work is done (any other ending is a failure).
ONE_SHOT_TASKS = ("catch-up", "takeover")
# How often a takeover tries again to read what the database records as settled.
SETTLED_RETRY_S = 1.0


def _reraise_if_cancelled(exc: BaseException) -> None:
    """Drivers may turn a cancellation into their own error (asyncpg, SQLAlchemy): a loop that
    catches Exception must not swallow it, or ``stop()`` would wait for it forever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError() from exc


class PeriodicTaskManager:
    """Keeps one scheduler entry per schedule of ``provider`` and enqueues due slots to ``target``."""

    def __init__(
        self,
        provider: ConfigProvider | None,
        target: Target,
        *,
        clock: Clock | None = None,
        sync_interval: float = 30.0,
        grace: float = 30.0,
        store: RuntimeStore | None = None,
        heartbeat_interval: float = 5.0,
        manager_id: str | None = None,
        pre_enqueue: PreEnqueueHook | None = None,
        post_enqueue: PostEnqueueHook | None = None,
        on_error: ErrorHook | None = None,
        close_target: bool = False,
        leadership: Leadership | None = None,
        catchup_window: float = 3600.0,
        full_sync_interval: float = 300.0,
        signals: Sequence[ChangeSignal] = (),
    ) -> None:
        self.provider: ConfigProvider = provider or StaticProvider()
        self.target = target
        # A provider that can tell what changed builds rows as entries (the scheduler adopts
        # them without a copy) and reuses the entries it finds unchanged.
        self._incremental = self.provider if isinstance(self.provider, IncrementalProvider) else None
        if self._incremental is not None:
            self._incremental.adopt(ScheduledEntry, self._known_config)
        self._forgetful = target if isinstance(target, Forgetful) else None
        self.clock: Clock = clock or SystemClock()
        self.sync_interval = sync_interval
        self.heartbeat_interval = heartbeat_interval
        self.store: RuntimeStore = store or MemoryRuntimeStore()
        self.manager_id = manager_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.scheduler = Scheduler(
            target,
            clock=self.clock,
            grace=grace,
            pre_enqueue=pre_enqueue,
            post_enqueue=post_enqueue,
            on_error=on_error,
            on_runs=self.store_runs,
            observe=self._observe_runs,
            catchup_window=catchup_window,
        )
        # Nothing is sent until leadership is decided (at once for AlwaysLeader).
        self.scheduler.set_active(False)
        self.leadership: Leadership = leadership or AlwaysLeader()
        self._terms = 0  # counts leadership changes
        self._running = False
        self._beat_now = asyncio.Event()
        self.full_sync_interval = timedelta(seconds=full_sync_interval)
        self.signals: list[ChangeSignal] = list(signals)
        self._revision: int | None = None
        self._last_full: datetime | None = None
        self.publisher = EntryPublisher(
            self.store,
            self.manager_id,
            on_failure=self._store_failed,
            checked=_reraise_if_cancelled,
            quiet=self._no_sync,
            between=self.scheduler.wait_idle,
        )
        # options.overlap: held slots and previous tasks are published with their entries.
        self.publisher.views = self.scheduler.overlap.view
        self.scheduler.overlap.changed = self.publisher.upsert
        self.reconciler = Reconciler(self.scheduler, self.publisher, checked=_reraise_if_cancelled)
        self.reconciler.keeper = self._last_good_keeper()
        self._sync_requested = asyncio.Event()
        self._sync_lock = asyncio.Lock()
        self._beat_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self.started_at: datetime | None = None
        self.last_sync_at: datetime | None = None
        self.last_sync_error: str | None = None
        self.failed: BaseException | None = None
        self.failed_task: str | None = None
        self._registered = False
        self._close_target = close_target
        self.metrics = ManagerMetrics(self)  # its own registry: served by /metrics or a port

    def _last_good_keeper(self) -> LastGoodKeeper:
        """Keeps the last good version of a row that turns bad: in the store when it can hold one
        (so a restart or a takeover runs it too), judged by the provider when read back."""
        return LastGoodKeeper(
            self.scheduler,
            self.publisher,
            self.manager_id,
            store=self.store if isinstance(self.store, LastGoodStore) else None,
            judge=self._incremental.judge_stored if self._incremental is not None else None,
            checked=_reraise_if_cancelled,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Publish this manager, run the first sync, then start the loops."""
        self.started_at = self.clock.now()
        info = ManagerInfo(self.manager_id, socket.gethostname(), os.getpid(), __version__, self.started_at)
        try:
            await self.store.register_manager(info, self._status())
            self._registered = True
        except Exception as exc:
            log.warning("could not publish manager %s (will retry): %s", self.manager_id, exc)
        self._spawn(self.publisher.run(), "publisher")
        await self.sync()
        await self.leadership.start(self._on_leadership)
        self._supervise(self.leadership.task)
        for signal in self.signals:
            await signal.start(self.request_sync)
            self._supervise(signal.task)
        self._running = True
        self._spawn(self.scheduler.run(), "scheduler")
        self._spawn(self._sync_loop(), "sync-loop")
        self._spawn(self._heartbeat_loop(info), "heartbeat")
        if self._forgetful is not None:
            self._spawn(self._watch_brokers(self._forgetful), "broker-watch")
        log.info(
            "manager %s started with %d entries (%s)", self.manager_id, len(self.scheduler),
            "leader" if self.is_leader else "standby",
        )

    async def stop(self) -> None:
        """Stop the loops (an enqueue under way finishes first) and unpublish this manager."""
        self._running = False
        self.scheduler.stop()
        for signal in self.signals:
            await signal.stop()
        for task in self._tasks:
            if task.get_name().endswith("scheduler"):
                continue
            task.cancel()
        if self._tasks:
            # Bounded: a task that does not end (a driver that swallowed its cancellation, say)
            # is reported by name instead of hanging the shutdown.
            _, pending = await asyncio.wait(self._tasks, timeout=STOP_TIMEOUT_S)
            for task in pending:
                log.error("%s did not stop within %.0f s; abandoned", task.get_name(), STOP_TIMEOUT_S)
        self._tasks.clear()
        await self.publisher.flush()
        await self.leadership.stop()
        try:
            await self.store.unregister_manager(self.manager_id)
        except Exception as exc:
            log.warning("could not unpublish manager %s: %s", self.manager_id, exc)
        if self._close_target:
            await self.target.close()
        log.info("manager %s stopped", self.manager_id)

    def _spawn(self, coro: object, name: str) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        task.set_name(f"periodic-manager-{name}")
        task.add_done_callback(self._on_task_done)
        self._tasks.append(task)

    def _supervise(self, task: asyncio.Task[Any] | None) -> None:
        """Watch a long-lived task of a collaborator (leadership, change listener) like our own."""
        if task is not None:
            task.add_done_callback(self._on_task_done)

    def _on_task_done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        name = task.get_name()
        if exc is None:
            if not self._running or name.endswith(ONE_SHOT_TASKS):
                return
            exc = RuntimeError("ended unexpectedly")
        # A supervised loop must never die quietly: the process stops being healthy (the CLI
        # exits non-zero, /healthz fails) and says why in one line; the traceback is at DEBUG.
        if self.failed is None:
            self.failed = exc
            self.failed_task = name
        log.critical("%s died: %s: %s", name, type(exc).__name__, exc)
        log.debug("%s traceback", name, exc_info=exc)

    def health(self) -> str | None:
        """None while every loop runs; otherwise why this manager is not healthy (one line)."""
        if self.failed is not None:
            return f"{self.failed_task} died: {type(self.failed).__name__}: {self.failed}"
        hung = self.scheduler.hung_for(self.clock.now())
        if hung > HUNG_AFTER_S:
            return f"dispatch has shown no progress for {hung:.0f} s (a target call that never returns)"
        return None

    # -- leadership --------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.leadership.is_leader

    @property
    def registry(self) -> CollectorRegistry:
        """This manager's Prometheus metrics (``/metrics``, or the CLI's metrics port)."""
        return self.metrics.registry

    def _on_leadership(self, is_leader: bool) -> None:
        now = self.clock.now()
        self._terms += 1  # a takeover still reading belongs to the term it started in
        if is_leader and self._running:
            # A standby taking over resumes within grace (the old leader may have missed those
            # slots), after what the database records as settled: off the leadership check.
            self._spawn(self._take_over(now, self._terms), "takeover")
        elif is_leader:
            # A fresh start fires nothing old.
            self.scheduler.set_active(True)
            log.info("manager %s leads (start)", self.manager_id)
            self._spawn(self._catch_up(now, takeover=False), "catch-up")
        else:
            self.scheduler.set_active(False)
            log.info("manager %s is standby", self.manager_id)
        self._beat_now.set()

    async def _take_over(self, now: datetime, term: int) -> None:
        """Start sending as the new leader: every entry resumes at its first slot after
        ``now - grace`` that is after the schedule's latest settled slot in the store, so no slot
        the old leader settled is sent again, even when the broker's claims are gone."""
        since = now - self.scheduler.grace
        settled = await self._settled_after(since, term)
        if settled is None:
            return  # no longer leading: the next term decides
        self.scheduler.set_active(True, resume_after=since, settled=settled)
        log.info("manager %s leads (takeover)", self.manager_id)
        await self._catch_up(now, takeover=True)

    async def _settled_after(self, since: datetime, term: int) -> dict[int | str, datetime] | None:
        """What the store records as settled after ``since``, by ident, each capped at now (a
        value from the future only means nothing in the past may be sent). Retried while this
        term lasts; None once it ended."""
        failed = False
        while term == self._terms:
            try:
                rows = await self.store.settled_after(since)
            except Exception as exc:
                _reraise_if_cancelled(exc)
                if not failed:
                    log.error(
                        "takeover waits: cannot read the settled slots (%s: %s); nothing is "
                        "sent until they are known", type(exc).__name__, exc,
                    )
                failed = True
                await self.clock.sleep(SETTLED_RETRY_S)
                continue
            if term != self._terms:
                break  # leadership changed during the read
            if failed:
                log.info("takeover: settled slots read")
            now = self.clock.now()
            settled: dict[int | str, datetime] = {}
            shared: dict[datetime, datetime] = {}  # a burst settles many schedules at one slot
            for key, at in rows.items():
                at = min(at, now)
                settled[ident_of(key)] = shared.setdefault(at, at)
            return settled
        return None

    async def _catch_up(self, now: datetime, *, takeover: bool) -> None:
        """misfire=fire_once: send the latest missed slot within the catch-up window, once."""
        await catchup.catch_up(
            self.scheduler, self.store, now, takeover=takeover, still_leading=lambda: self.is_leader
        )

    # -- code API ----------------------------------------------------------------------------

    def register(self, config: PeriodicTaskConfig) -> ScheduledEntry:
        """Register a schedule from code (kept across syncs until :meth:`unregister`).

        Raises ConfigError (``options.overlap``) when the schedule asks for skip or hold and its
        target cannot tell when a task finished."""
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

    def request_sync(self) -> None:
        """Ask for a sync as soon as possible (non-blocking; bursts coalesce into one sync)."""
        self._sync_requested.set()

    # -- sync --------------------------------------------------------------------------------

    async def sync(self, *, full: bool = False) -> SyncReport:
        """Reconcile the entries with the provider: only what changed when the provider can tell
        (and a full read at least every ``full_sync_interval``), or everything with ``full``."""
        async with self._sync_lock:
            with self.metrics.time_sync(), gcpolicy.paused():
                report = await self._sync(full=full)
                if report.added + report.replaced >= FREEZE_AFTER:
                    gcpolicy.freeze()  # see gcpolicy: the survivors are never walked again
                    gcpolicy.release()
                return report

    async def _sync(self, *, full: bool = False) -> SyncReport:
        now = self.clock.now()
        provider = self._incremental
        incremental = (
            not full
            and provider is not None
            and self._revision is not None
            and self._last_full is not None
            and now - self._last_full < self.full_sync_interval
        )
        try:
            if incremental:
                assert provider is not None and self._revision is not None
                changes = await provider.get_changes(self._revision)
                if changes is not None and not changes.full:
                    report = await self.reconciler.apply_changes(changes, now)
                    self._revision = changes.revision
                    return self._finish(report, now)
                if changes is None:
                    return self._finish(SyncReport(ok=True), now)
            snapshot = await self.provider.get_configs()
        except Exception as exc:
            _reraise_if_cancelled(exc)
            msg = f"{type(exc).__name__}: {exc}"
            if msg != self.last_sync_error:
                log.error("sync failed, keeping %d entries: %s", len(self.scheduler), msg)
            self.last_sync_error = msg
            self._last_full = None  # after an outage, reconcile everything once
            return SyncReport(ok=False, error=msg)
        report = await self.reconciler.apply_snapshot(snapshot, now)
        self._revision = snapshot.revision
        self._last_full = now
        self.scheduler.forget_retired(now - RETIRED_MEMORY)
        if provider is not None:
            await self.publisher.call(
                provider.prune_tombstones(now - TOMBSTONE_RETENTION), "pruning tombstones"
            )
        return self._finish(report, now)

    def _finish(self, report: SyncReport, now: datetime) -> SyncReport:
        if self.last_sync_error is not None:
            log.info("sync recovered")
        self.last_sync_error = None
        self.last_sync_at = now
        if report.added or report.replaced or report.removed or report.errors:
            log.info(
                "sync: %d added, %d replaced, %d removed, %d unchanged, %d bad rows",
                report.added, report.replaced, report.removed, report.unchanged,
                len(report.errors),
            )
        return report

    async def _no_sync(self) -> None:
        """Return when no sync is under way."""
        async with self._sync_lock:
            pass

    def _known_config(self, row_id: int) -> PeriodicTaskConfig | None:
        entry = self.scheduler.get(row_id)
        return entry if entry is not None and entry.synced else None

    def _store_failed(self, exc: BaseException) -> None:
        self._registered = False  # republish this manager and its entries at the next heartbeat

    def _observe_runs(self, runs: Sequence[RunRecord]) -> None:
        self.metrics.observe_runs(runs)

    async def store_runs(self, runs: Sequence[RunRecord]) -> None:
        await self.store.record_runs(runs)

    # -- loops -------------------------------------------------------------------------------

    async def _sync_loop(self) -> None:
        while True:
            sleeper = asyncio.ensure_future(self.clock.sleep(self.sync_interval))
            waker = asyncio.ensure_future(self._sync_requested.wait())
            try:
                await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                waker.cancel()
                await asyncio.gather(sleeper, waker, return_exceptions=True)
            self._sync_requested.clear()
            await self.sync()

    def _status(self) -> ManagerStatus:
        return ManagerStatus(
            heartbeat_at=self.clock.now(),
            is_leader=self.is_leader,
            last_sync_at=self.last_sync_at,
            last_sync_error=self.last_sync_error,
            entry_count=len(self.scheduler),
        )

    async def _heartbeat_loop(self, info: ManagerInfo) -> None:
        while True:
            sleeper = asyncio.ensure_future(self.clock.sleep(self.heartbeat_interval))
            waker = asyncio.ensure_future(self._beat_now.wait())  # leadership changed
            try:
                await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                waker.cancel()
                await asyncio.gather(sleeper, waker, return_exceptions=True)
            self._beat_now.clear()
            async with self._beat_lock:
                await self._beat(info)

    async def _beat(self, info: ManagerInfo) -> None:
        try:
            if not self._registered:
                # The store was unreachable: publish this manager and all its entries again.
                await self.store.register_manager(info, self._status())
                await self.store.apply_entries(self.manager_id, self._all_records(), [])
                self._registered = True
            status = self._status()
            await self.store.heartbeat(self.manager_id, status)
            # Reap relative to the instant just written, so this manager never reaps itself.
            await self.store.reap(status.heartbeat_at - timedelta(seconds=3 * self.heartbeat_interval))
        except Exception as exc:
            _reraise_if_cancelled(exc)
            if self._registered:
                log.warning("heartbeat failed (will retry): %r", exc)
            self._registered = False

    async def _watch_brokers(self, target: Forgetful) -> None:
        """Every heartbeat interval, in a loop of its own (a broker slow to answer never delays
        the heartbeat): say once, loudly, when a target's broker lost its data (a Redis restarted
        without persistence): its claims of recent slots are gone (see ``targets.sentinel``)."""
        while True:
            await self.clock.sleep(self.heartbeat_interval)
            await self._look_at_brokers(target)

    async def _look_at_brokers(self, target: Forgetful) -> None:
        try:
            lost = await target.forgotten()
        except Exception as exc:
            _reraise_if_cancelled(exc)
            return  # the broker is down: the sends and /readyz say so
        for name in lost:
            self.metrics.broker_data_lost(name)
            log.error(
                "the %s target's broker lost its data (restarted without persistence, flushed "
                "or failed over to an empty replica): its claims of recent slots are gone. A "
                "takeover still sends no slot the database records as settled; a slot in "
                "flight may be sent twice.", name,
            )

    def _all_records(self) -> list[EntryRecord]:
        view = self.scheduler.overlap.view
        records = [entry_record(e, view(e.ident)) for e in self.scheduler.entries()]
        return records + list(self.reconciler.row_errors.values())

    async def wait_settled(self, instant: datetime) -> None:
        """Wait until slots due by ``instant`` are handled and no sync is running (for tests)."""
        await self.scheduler.wait_processed(instant)
        async with self._sync_lock, self._beat_lock:
            pass
        await self.flush()

    async def flush(self) -> None:
        """Wait until every entry change so far is published to the store."""
        await self.publisher.flush()
