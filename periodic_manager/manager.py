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
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from periodic_manager import __version__, gcpolicy
from periodic_manager.clock import Clock, SystemClock
from periodic_manager.config import PeriodicTaskConfig, content_hash
from periodic_manager.errors import NotFoundError
from periodic_manager.leadership import AlwaysLeader, Leadership
from periodic_manager.metrics import ManagerMetrics
from periodic_manager.providers.base import (
    ChangeSet,
    ConfigProvider,
    ProviderSnapshot,
    RowError,
    StaticProvider,
)
from periodic_manager.registry import (
    EntryRecord,
    ManagerInfo,
    ManagerStatus,
    MemoryRuntimeStore,
    RunRecord,
    RuntimeStore,
)
from periodic_manager.scheduler import (
    ErrorHook,
    PostEnqueueHook,
    PreEnqueueHook,
    ScheduledEntry,
    Scheduler,
    lookback_floor,
)
from periodic_manager.targets.base import Target

log = logging.getLogger(__name__)

# Tombstones of deleted rows are kept this long; a full reconcile (at least every
# full_sync_interval, and after any failed sync) covers whatever is pruned.
TOMBSTONE_RETENTION = timedelta(days=1)
# Long CPU-bound loops (a sync of 100,000 rows) yield to the event loop this often, so a
# leadership check is never starved past its deadline.
YIELD_EVERY = 500
STOP_TIMEOUT_S = 30.0
# A sync that registers this many entries freezes the survivors out of the garbage collector.
FREEZE_AFTER = 10_000
# A dispatch silent for this long is stuck: every target call is bounded far below it.
HUNG_AFTER_S = 120.0
# Tasks that end by themselves once their work is done (any other ending is a failure).
ONE_SHOT_TASKS = ("catch-up",)


def _reraise_if_cancelled(exc: BaseException) -> None:
    """Drivers may turn a cancellation into their own error (asyncpg, SQLAlchemy): a loop that
    catches Exception must not swallow it, or ``stop()`` would wait for it forever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError() from exc


class ChangeSignal(Protocol):
    """Something that calls ``manager.request_sync()`` when schedules change (e.g. LISTEN)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(slots=True)
class SyncReport:
    """What one sync did."""

    ok: bool
    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: int = 0
    errors: list[RowError] = field(default_factory=list)
    error: str | None = None


def _entry_record(entry: ScheduledEntry) -> EntryRecord:
    cfg = entry.config
    return EntryRecord(
        entry_id=entry.entry_id,
        schedule_key=cfg.key,
        name=cfg.name,
        content_hash=entry.content_hash,
        status="active",
        registered_at=entry.registered_at,
        spec=cfg.spec,
        timezone=cfg.timezone,
        anchor=cfg.anchor,
        task_type=cfg.task_type,
        queue=cfg.queue,
    )


def _unusable(cfg: PeriodicTaskConfig, exc: BaseException) -> RowError:
    """A config the provider accepted but the scheduler could not register, as a row error."""
    return RowError(
        schedule_id=cfg.schedule_id if cfg.schedule_id is not None else cfg.key,
        name=cfg.name,
        content_hash=content_hash(cfg),
        field="row",
        reason=f"cannot be scheduled: {type(exc).__name__}: {exc}",
    )


def _error_record(err: RowError, now: datetime) -> EntryRecord:
    return EntryRecord(
        entry_id=f"{err.schedule_id}-error-{err.content_hash[:12]}",
        schedule_key=str(err.schedule_id),
        name=err.name,
        content_hash=err.content_hash,
        status="error",
        registered_at=now,
        last_error=err.message,
    )


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
        self.leadership.on_change = self._on_leadership
        self._running = False
        self._beat_now = asyncio.Event()
        self.full_sync_interval = timedelta(seconds=full_sync_interval)
        self.signals: list[ChangeSignal] = list(signals)
        self._revision: int | None = None
        self._last_full: datetime | None = None
        self._unpublished: dict[str, EntryRecord | None] = {}  # entry id -> record (None: removed)
        self._publish_ready = asyncio.Event()
        self._publish_lock = asyncio.Lock()
        self._synced: dict[str, str] = {}  # schedule key -> entry id, for entries owned by sync
        self._code: dict[str, str] = {}  # schedule key -> entry id, registered from code
        self._row_errors: dict[str, EntryRecord] = {}  # schedule key -> published error record
        self._logged: set[tuple[str, str]] = set()  # (schedule key, content hash) already logged
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
        self._spawn(self._publisher(), "publisher")
        await self.sync()
        await self.leadership.start()
        self._supervise(getattr(self.leadership, "task", None))
        for signal in self.signals:
            await signal.start()
            self._supervise(getattr(signal, "task", None))
        self._running = True
        self._spawn(self.scheduler.run(), "scheduler")
        self._spawn(self._sync_loop(), "sync-loop")
        self._spawn(self._heartbeat_loop(info), "heartbeat")
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
        await self._flush_entries()
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

    def _on_leadership(self, is_leader: bool) -> None:
        now = self.clock.now()
        if is_leader:
            # A standby taking over resumes within grace (the old leader may have missed those
            # slots; the target's claim drops any it did send). A fresh start fires nothing old.
            takeover = self._running
            self.scheduler.set_active(True, resume_after=now - self.scheduler.grace if takeover else None)
            log.info("manager %s leads (%s)", self.manager_id, "takeover" if takeover else "start")
            self._spawn(self._catch_up(now, takeover=takeover), "catch-up")
        else:
            self.scheduler.set_active(False)
            log.info("manager %s is standby", self.manager_id)
        self._beat_now.set()

    async def _catch_up(self, now: datetime, *, takeover: bool) -> None:
        """misfire=fire_once: send the latest missed slot within the catch-up window, once."""
        candidates: list[tuple[ScheduledEntry, datetime]] = []
        for entry in self.scheduler.entries():
            if entry.config.options.get("misfire") != "fire_once":
                continue
            # A slot exactly one window late still counts; one at effective_at does not.
            earliest = now - self.scheduler.window(entry) - timedelta(microseconds=1)
            floor = lookback_floor(entry.config, now)
            if floor is not None and floor > earliest:
                earliest = floor  # never a slot from before the schedule (or its timing) existed
            try:
                slot = latest_slot(entry, now, earliest)
            except (OverflowError, ValueError) as exc:
                log.error("catch-up of %s skipped: %s", entry.config.name, exc)
                continue
            if slot is None or (takeover and slot > now - self.scheduler.grace):
                continue  # nothing missed, or the normal path sends it
            candidates.append((entry, slot))
        if not candidates:
            return
        try:
            state = await self.store.get_state([e.key for e, _ in candidates])
        except Exception as exc:
            # Without the state we cannot know what was sent beyond the claims' life: skip.
            log.error("catch-up skipped, runtime state unreadable: %s", exc)
            return
        todo = [
            (e, s) for e, s in candidates
            if (st := state.get(e.key)) is None or st.last_slot_at is None or st.last_slot_at < s
        ]
        if todo and self.is_leader:
            await self.scheduler.catch_up(todo)

    # -- code API ----------------------------------------------------------------------------

    def register(self, config: PeriodicTaskConfig) -> ScheduledEntry:
        """Register a schedule from code (kept across syncs until :meth:`unregister`)."""
        old = self._code.get(config.key)
        entry = self.scheduler.register(config, replaces=old)
        self._code[config.key] = entry.entry_id
        self._publish([_entry_record(entry)], [old] if old and old != entry.entry_id else [])
        return entry

    def unregister(self, name_or_key: str) -> None:
        """Remove a schedule registered from code, by name or key."""
        key = name_or_key if name_or_key in self._code else f"name:{name_or_key}"
        eid = self._code.pop(key, None)
        if eid is None:
            raise NotFoundError(name_or_key)
        self.scheduler.unregister(eid)
        self._publish([], [eid])

    def entries(self) -> list[ScheduledEntry]:
        return self.scheduler.entries()

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
                if len(report.added) + len(report.replaced) >= FREEZE_AFTER:
                    gcpolicy.freeze()  # see gcpolicy: the survivors are never walked again
                return report

    async def _sync(self, *, full: bool = False) -> SyncReport:
        now = self.clock.now()
        get_changes = getattr(self.provider, "get_changes", None)
        incremental = (
            not full
            and get_changes is not None
            and self._revision is not None
            and self._last_full is not None
            and now - self._last_full < self.full_sync_interval
        )
        try:
            if incremental:
                changes = await get_changes(self._revision)
                if changes is not None and not changes.full:
                    return self._finish(await self._apply_changes(changes, now), now)
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
        report = await self._apply_snapshot(snapshot, now)
        self._revision = snapshot.revision
        self._last_full = now
        prune = getattr(self.provider, "prune_tombstones", None)
        if prune is not None:
            await self._store_call(prune(now - TOMBSTONE_RETENTION), "pruning tombstones")
        return self._finish(report, now)

    def _finish(self, report: SyncReport, now: datetime) -> SyncReport:
        if self.last_sync_error is not None:
            log.info("sync recovered")
        self.last_sync_error = None
        self.last_sync_at = now
        if report.added or report.replaced or report.removed or report.errors:
            log.info(
                "sync: %d added, %d replaced, %d removed, %d unchanged, %d bad rows",
                len(report.added), len(report.replaced), len(report.removed), report.unchanged,
                len(report.errors),
            )
        return report

    async def _apply_snapshot(self, snapshot: ProviderSnapshot, now: datetime) -> SyncReport:
        """Full reconcile: the snapshot is the whole truth."""
        report = SyncReport(ok=True, errors=list(snapshot.errors))
        upserts: list[EntryRecord] = []
        removed: list[str] = []
        desired: dict[str, PeriodicTaskConfig] = {c.key: c for c in snapshot.configs}
        bad = {str(e.schedule_id) for e in snapshot.errors}
        for key in list(self._synced):
            # A row that turned bad keeps its last good entry running (nothing is lost).
            if key not in desired and key not in bad:
                self._remove(key, removed, report)
        for i, cfg in enumerate(desired.values()):
            self._upsert(cfg, upserts, removed, report)
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # let leadership checks and dispatch run
        self._sync_row_errors(report.errors, set(self._synced) | set(desired), now, upserts, removed)
        self._publish_diff(upserts, removed)
        return report

    async def _apply_changes(self, changes: ChangeSet, now: datetime) -> SyncReport:
        """Incremental: only what changed since the last revision read."""
        report = SyncReport(ok=True, errors=list(changes.errors))
        upserts: list[EntryRecord] = []
        removed: list[str] = []
        for key in changes.removed:
            self._remove(key, removed, report)
            rec = self._row_errors.pop(key, None)
            if rec is not None:
                removed.append(rec.entry_id)
        for i, cfg in enumerate(changes.configs):
            if self._upsert(cfg, upserts, removed, report):
                rec = self._row_errors.pop(cfg.key, None)
                if rec is not None:
                    removed.append(rec.entry_id)
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                # A bulk INSERT of 100,000 rows arrives as one change set: dispatch and the
                # leadership proof must not wait for all of it.
                await asyncio.sleep(0)
        self._publish_row_errors(report.errors, now, upserts, removed)
        self._revision = changes.revision
        self._publish_diff(upserts, removed)
        return report

    def _remove(self, key: str, removed: list[str], report: SyncReport) -> None:
        eid = self._synced.pop(key, None)
        if eid is not None:
            self.scheduler.unregister(eid)
            removed.append(eid)
            report.removed.append(eid)

    def _upsert(
        self, cfg: PeriodicTaskConfig, upserts: list[EntryRecord], removed: list[str], report: SyncReport
    ) -> bool:
        """Register ``cfg`` unless its entry is already current; False if it cannot be scheduled
        (then a row error is added to the report and any previous entry keeps running)."""
        current = self._synced.get(cfg.key)
        entry = self.scheduler.get(current) if current else None
        # The provider hands back the same object for an unchanged row: no hashing needed.
        if entry is not None and entry.config is cfg:
            report.unchanged += 1
            return True
        digest = content_hash(cfg)
        if entry is not None and entry.content_hash == digest and entry.config.name == cfg.name:
            # Same content and keys; only bookkeeping (effective_at) may have moved.
            entry.config = cfg
            report.unchanged += 1
            return True
        try:
            new = self.scheduler.register(cfg, digest=digest, replaces=current)
        except Exception as exc:  # noqa: BLE001 - one schedule must never stop the sync
            _reraise_if_cancelled(exc)
            report.errors.append(_unusable(cfg, exc))
            return False
        if current is not None:
            removed.append(current)
        self._synced[cfg.key] = new.entry_id
        upserts.append(_entry_record(new))
        (report.replaced if current else report.added).append(new.entry_id)
        return True

    def _publish_diff(self, upserts: list[EntryRecord], removed: list[str]) -> None:
        upserted = {u.entry_id for u in upserts}
        self._publish(upserts, [r for r in removed if r not in upserted])

    def _sync_row_errors(
        self,
        errors: Sequence[RowError],
        known: set[str],
        now: datetime,
        upserts: list[EntryRecord],
        removed: list[str],
    ) -> None:
        """Full sync: publish current bad rows and drop reports of rows now fixed or gone."""
        current = {str(e.schedule_id) for e in errors}
        self._publish_row_errors(errors, now, upserts, removed)
        for key in list(self._row_errors):
            if key not in current:
                removed.append(self._row_errors.pop(key).entry_id)
        self._logged = {(k, h) for (k, h) in self._logged if k in current or k in known}

    def _publish_row_errors(
        self, errors: Sequence[RowError], now: datetime, upserts: list[EntryRecord], removed: list[str]
    ) -> None:
        """Log each bad row once per content and publish it (visible through the API)."""
        for err in errors:
            key = str(err.schedule_id)
            if (key, err.content_hash) not in self._logged:
                self._logged.add((key, err.content_hash))
                kept = " (its previous version keeps running)" if key in self._synced else ""
                log.error(
                    "schedule row %s (%s) rejected: %s%s", key, err.name, err.message, kept,
                    extra={"schedule": err.name, "schedule_id": key, "field": err.field},
                )
            rec = _error_record(err, now)
            old = self._row_errors.get(key)
            if old is None or old.entry_id != rec.entry_id:
                if old is not None:
                    removed.append(old.entry_id)
                self._row_errors[key] = rec
                upserts.append(rec)

    def _publish(self, upserts: list[EntryRecord], removed: list[str]) -> None:
        """Queue entry changes for the store. Publishing is for visibility: a sync (or a cold
        start of 100,000 entries) never waits for it, and changes queued meanwhile coalesce."""
        if not upserts and not removed:
            return
        for entry_id in removed:
            self._unpublished[entry_id] = None
        for rec in upserts:
            self._unpublished[rec.entry_id] = rec
        self._publish_ready.set()

    async def _publisher(self) -> None:
        while True:
            await self._publish_ready.wait()
            self._publish_ready.clear()
            await self._flush_entries()

    async def _flush_entries(self) -> None:
        if not self._unpublished:
            return
        pending, self._unpublished = self._unpublished, {}
        upserts = [rec for rec in pending.values() if rec is not None]
        removed = [eid for eid, rec in pending.items() if rec is None]
        async with self._publish_lock:
            await self._store_call(self.store.apply_entries(self.manager_id, upserts, removed), "publishing entries")

    async def _store_call(self, coro: object, what: str) -> None:
        try:
            await coro  # type: ignore[misc]
        except Exception as exc:  # the store is for visibility; scheduling goes on without it
            _reraise_if_cancelled(exc)
            log.warning("%s failed (republished at the next heartbeat): %r", what, exc)
            self._registered = False

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

    def _all_records(self) -> list[EntryRecord]:
        return [_entry_record(e) for e in self.scheduler.entries()] + list(self._row_errors.values())

    async def wait_settled(self, instant: datetime) -> None:
        """Wait until slots due by ``instant`` are handled and no sync is running (for tests)."""
        await self.scheduler.wait_processed(instant)
        async with self._sync_lock, self._beat_lock:
            pass
        await self.flush()

    async def flush(self) -> None:
        """Wait until every entry change so far is published to the store."""
        await self._flush_entries()
        async with self._publish_lock:
            pass


def latest_slot(entry: ScheduledEntry, now: datetime, earliest: datetime) -> datetime | None:
    """The latest slot of ``entry`` in ``(earliest, now]``, if any.

    Searches back from ``now`` in doubling spans, so the cost follows the gap before the latest
    slot, not the number of slots in the window: walking an hour of ``@every 1s`` took 35 ms per
    schedule, and a takeover with a hundred of them blocked the event loop (and with it the
    leadership checks) for seconds.
    """
    span = timedelta(seconds=1)
    while True:
        start = max(earliest, now - span)
        slot = entry.schedule.next_after(start)
        if slot <= now:
            found = slot
            while (slot := entry.schedule.next_after(slot)) <= now:
                found = slot
            return found
        if start == earliest:
            return None
        span *= 2
