"""Syncs: keeping the scheduler's entries equal to the provider's rows.

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
failure keeps every entry and is retried.

:class:`Reconciler` applies what was read: a schedule whose content hash and name are unchanged
keeps its entry and its timing; a changed one is replaced (:meth:`Scheduler.register` keeps or
carries its pending slot); a row deleted or disabled loses its entry. A row the provider rejected
is logged once per (row, content) and published as an error record; if it had a good version
before, that version keeps running (nothing is lost), also after a restart or a takeover
(:mod:`periodic_manager.runtime.last_good`). Long passes run in turns with the other tasks, so a
bulk change of 100,000 rows never holds dispatch or the leadership proof.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from periodic_manager import gcpolicy
from periodic_manager.clock import next_tick, sleep_unless
from periodic_manager.contracts import (
    ChangeSet,
    Clock,
    ConfigProvider,
    DigestingProvider,
    EntryRecord,
    IncrementalProvider,
    ProviderSnapshot,
    RowError,
)
from periodic_manager.engine.entries import Counted
from periodic_manager.engine.entry import ScheduledEntry, lookback_floor
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.pacing import in_turns
from periodic_manager.runtime.last_good import LastGoodKeeper
from periodic_manager.runtime.limited import StateReader, limited, read_counted
from periodic_manager.runtime.metrics import ManagerMetrics
from periodic_manager.runtime.publishing import EntryPublisher, error_record
from periodic_manager.runtime.tasks import reraise_if_cancelled
from periodic_manager.runtime.timing import Timing
from periodic_manager.schedules.definition import PeriodicTaskConfig, content_hash, ident_of

log = logging.getLogger(__name__)

_LOOK_UP = object()
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


@dataclass(slots=True)
class SyncReport:
    """What one sync did (schedules by key)."""

    ok: bool
    added: int = 0
    replaced: int = 0
    removed: int = 0
    unchanged: int = 0
    errors: list[RowError] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True, slots=True)
class BadRow:
    """A row the reconciler knows to be bad: the provider's verdict, and the error record
    published for it (the API shows it)."""

    error: RowError
    record: EntryRecord


class Reconciler:
    """Keeps the scheduler's sync-owned entries equal to the provider's rows."""

    def __init__(
        self,
        scheduler: Scheduler,
        publisher: EntryPublisher,
        keeper: LastGoodKeeper,
        read_state: StateReader | None = None,
    ) -> None:
        self.scheduler = scheduler
        # options.max_runs: what the store records of a limited schedule registered afresh.
        self.read_state = read_state
        self._counted: dict[int | str, Counted] = {}
        # When the previous successful read began (None before the first): a row that came into
        # effect after it is new, and its slots start at its creation (see _created_start).
        self.seen_before: datetime | None = None
        self.publisher = publisher
        # Partitions: whether this manager holds the schedule of an ident now (a read that began
        # before a partition was lost must not bring its entries back). None: it holds all.
        self.keep: Callable[[int | str], bool] | None = None
        # Stores the last good version of rows that turn bad, and runs the stored one of bad rows
        # this manager holds nothing for.
        self.keeper = keeper
        self.row_errors: dict[str, BadRow] = {}  # schedule key -> its error, as published
        self._logged: set[tuple[str, str]] = set()  # (schedule key, content hash) already logged

    async def apply_snapshot(self, snapshot: ProviderSnapshot, now: datetime) -> SyncReport:
        """Full reconcile: the snapshot is the whole truth."""
        report = SyncReport(ok=True, errors=list(snapshot.errors))
        # Every pass over all rows or entries runs in turns with the other tasks: with a million
        # of them one pass would hold the event loop for a few hundred milliseconds.
        desired: dict[int | str, PeriodicTaskConfig] = {}
        async for configs in in_turns(snapshot.configs):
            for c in configs:
                desired[c.ident] = c
        bad = {ident_of(str(e.schedule_id)) for e in snapshot.errors}
        held = self.scheduler.held()
        async for entries in in_turns(list(held.items())):
            for ident, entry in entries:
                # A row that turned bad keeps its last good entry running (nothing is lost).
                if entry.synced and ident not in desired and ident not in bad:
                    self._remove(ident, report)
        await self._read_counted(list(desired.values()))
        unchanged = 0
        async for rows in in_turns(list(desired.items())):
            now_ = self.scheduler.clock.now()
            for ident, cfg in rows:
                held_entry = held.get(ident)
                if held_entry is cfg:
                    unchanged += 1  # the provider reused the config: the row did not change
                else:
                    self._upsert(cfg, report, now_, held_entry)
        report.unchanged += unchanged
        current = {str(e.schedule_id) for e in report.errors}
        await self.keeper.after_full(report.errors, snapshot.revision, now)
        await self._publish_row_errors(report.errors, now)
        async for keys in in_turns(list(self.row_errors)):
            for key in keys:
                if key not in current:
                    self.publisher.remove(self.row_errors.pop(key).record.entry_id)
        self._logged = {(k, h) for (k, h) in self._logged if k in current}
        return report

    async def reaffirm(self, revision: int | None, now: datetime) -> None:
        """A full reconcile due when nothing was written since the last one (the provider said
        so): the rows and the bad rows are those already known, and the housekeeping of a full
        reconcile runs on them (the last good versions: stored ones forgotten or restored,
        unsaved ones saved; the row errors published with what they say now)."""
        errors = [bad.error for bad in self.row_errors.values()]
        await self.keeper.after_full(errors, revision, now)
        await self._publish_row_errors(errors, now)

    async def apply_changes(self, changes: ChangeSet, now: datetime) -> SyncReport:
        """Incremental: only what changed since the last revision read."""
        report = SyncReport(ok=True, errors=list(changes.errors))
        async for keys in in_turns(changes.removed):
            for key in keys:
                self._remove(key, report)
                self._clear_row_error(key)
        await self._read_counted(changes.configs)
        # A bulk INSERT of 100,000 rows arrives as one change set: dispatch and the leadership
        # proof must not wait for all of it.
        async for configs in in_turns(changes.configs):
            now_ = self.scheduler.clock.now()
            for cfg in configs:
                if self._upsert(cfg, report, now_):
                    self._clear_row_error(cfg.key)
        await self.keeper.after_changes(report.errors, changes, now)
        await self._publish_row_errors(report.errors, now)
        return report

    async def apply_some(self, snapshot: ProviderSnapshot, now: datetime) -> list[ScheduledEntry]:
        """Register the rows of ``snapshot`` (partitions just taken: nothing of them is held),
        publish its row errors; the entries registered."""
        report = SyncReport(ok=True, errors=list(snapshot.errors))
        await self._read_counted(snapshot.configs)  # options.max_runs: their counts first
        held = self.scheduler.held()
        async for configs in in_turns(snapshot.configs):
            now_ = self.scheduler.clock.now()
            for cfg in configs:
                self._upsert(cfg, report, now_, held.get(cfg.ident))
        await self._publish_row_errors(report.errors, now)
        return [e for c in snapshot.configs if (e := held.get(c.ident)) is not None]

    async def drop(self, gone: Callable[[int | str], bool]) -> int:
        """Unregister the synced entries and forget the row errors of every ident ``gone``
        accepts (partitions lost or handed over), in turns with the other tasks; how many
        entries. The caller fences them off first (:meth:`Scheduler.fence`): their sending
        stops at once, not when the pass reaches them."""
        report = SyncReport(ok=True)
        async for entries in in_turns(list(self.scheduler.held().items())):
            for ident, entry in entries:
                if entry.synced and gone(ident):
                    self._remove(ident, report)
        async for keys in in_turns([k for k in self.row_errors if gone(ident_of(k))]):
            for key in keys:
                self._clear_row_error(key)
        return report.removed

    async def _read_counted(self, configs: Sequence[PeriodicTaskConfig]) -> None:
        """Read what the store records of the limited configs that will not carry the runs left
        of a limited entry (new, resumed, or newly limited). A failed read fails the sync (the
        current entries keep running; it is retried): a limited schedule is never registered
        without its count."""
        held = self.scheduler.held()
        fresh = []
        for cfg in await limited(configs):
            entry = held.get(cfg.ident)
            if entry is None or entry.runs_left is None:
                fresh.append(cfg)
        self._counted = {}
        if fresh and self.read_state is not None:
            self._counted = await read_counted(self.read_state, fresh)

    def _remove(self, key: int | str, report: SyncReport) -> None:
        entry = self.scheduler.get(key)
        if entry is not None and entry.synced:
            self.scheduler.unregister(key)
            self.publisher.remove(entry.entry_id)
            report.removed += 1

    def _upsert(
        self, cfg: PeriodicTaskConfig, report: SyncReport, now: datetime, entry: Any = _LOOK_UP
    ) -> bool:
        """Register ``cfg`` unless its entry is already current; False if it cannot be scheduled
        (then a row error is added to the report and any previous entry keeps running).
        ``entry``: the current entry of its key, when the caller looked it up already."""
        if self.keep is not None and not self.keep(cfg.ident):
            return True  # its partition is not held (any more): another manager's
        if entry is _LOOK_UP:
            entry = self.scheduler.get(cfg.ident)
        # The provider hands back the same object for an unchanged row: no hashing needed.
        if entry is cfg:  # the provider reused what the entry holds
            report.unchanged += 1
            return True
        if (
            entry is not None
            and entry.name == cfg.name
            and content_hash(entry) == content_hash(cfg)
        ):
            # Same content and keys; only bookkeeping (effective_at, revision) may have moved.
            entry.refresh(cfg)
            report.unchanged += 1
            return True
        old_id = entry.entry_id if entry is not None else None
        try:
            new = self.scheduler.register(
                cfg,
                synced=True,
                now=now,
                counted=self._counted.get(cfg.ident),
                start=self._created_start(cfg, now) if entry is None else None,
            )
        except Exception as exc:  # noqa: BLE001 - one schedule must never stop the sync
            reraise_if_cancelled(exc)
            report.errors.append(_unusable(cfg, exc))
            return False
        if old_id is not None and old_id != new.entry_id:
            self.publisher.remove(old_id)
        self.publisher.upsert(new)
        if entry is not None:
            report.replaced += 1
        else:
            report.added += 1
        return True

    def _created_start(self, cfg: PeriodicTaskConfig, now: datetime) -> datetime | None:
        """When the slots of a schedule new to this manager start: at its ``effective_at`` (at
        most ``grace`` back) when it came into effect after the previous read began, so no read
        could have seen it before: the slots previewed since its creation are sent, however long
        the sync took to register it. None (start now) otherwise: at the first sync, and for a
        row older than the previous read (nothing fires at start)."""
        seen = self.seen_before
        floor = lookback_floor(cfg, now) if seen is not None else None
        if floor is None or seen is None or floor <= seen:
            return None
        return max(floor, now - self.scheduler.grace)

    def _clear_row_error(self, key: str) -> None:
        bad = self.row_errors.pop(key, None)
        if bad is not None:
            self.publisher.remove(bad.record.entry_id)

    async def _publish_row_errors(self, errors: Sequence[RowError], now: datetime) -> None:
        """Log each bad row once per content and publish it (visible through the API)."""
        async for part in in_turns(errors):
            for err in part:
                self._publish_row_error(err, now)

    def _publish_row_error(self, err: RowError, now: datetime) -> None:
        key = str(err.schedule_id)
        since = self._kept_since(key)
        if (key, err.content_hash) not in self._logged:
            self._logged.add((key, err.content_hash))
            kept = " (its previous version keeps running)" if self.scheduler.get(key) else ""
            if since is not None:
                kept = f" (its last good version keeps running, kept since {since.isoformat()})"
            log.error(
                "schedule row %s (%s) rejected: %s%s",
                key,
                err.name,
                err.message,
                kept,
                extra={"schedule": err.name, "schedule_id": key, "field": err.field},
            )
        rec = error_record(err.schedule_id, err.name, err.content_hash, err.message, now, since)
        old = self.row_errors.get(key)
        if (
            old is None
            or old.record.entry_id != rec.entry_id
            or old.record.last_good_since != since
        ):
            if old is not None:
                self.publisher.remove(old.record.entry_id)
            self.publisher.upsert(rec)
            self.row_errors[key] = BadRow(err, rec)
        elif old.error is not err:
            self.row_errors[key] = BadRow(err, old.record)  # published as it was

    def _kept_since(self, key: str) -> datetime | None:
        """Since when the last good version of row ``key`` keeps running here (None: none does)."""
        return self.keeper.since(key)


def _unusable(cfg: PeriodicTaskConfig, exc: BaseException) -> RowError:
    """A config the provider accepted but the scheduler could not register, as a row error."""
    return RowError(
        schedule_id=cfg.schedule_id if cfg.schedule_id is not None else cfg.key,
        name=cfg.name,
        content_hash=content_hash(cfg),
        field="row",
        reason=f"cannot be scheduled: {type(exc).__name__}: {exc}",
        revision=cfg.revision,
    )


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
            msg = f"{type(exc).__name__}: {exc}"
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
