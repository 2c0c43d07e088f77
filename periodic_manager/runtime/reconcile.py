"""Applying what a sync read: keeping the scheduler's entries equal to the provider's rows.

:class:`Reconciler` applies what :class:`~periodic_manager.runtime.sync.Syncer` read: a schedule
whose content hash and name are unchanged keeps its entry and its timing; a changed one is
replaced (:meth:`Scheduler.register` keeps or carries its pending slot); a row deleted or
disabled loses its entry. A row the provider rejected
is logged once per (row, content) and published as an error record; if it had a good version
before, that version keeps running (nothing is lost), also after a restart or a takeover
(:mod:`periodic_manager.runtime.last_good`). Long passes run in turns with the other tasks, so a
bulk change of 100,000 rows never holds dispatch or the leadership proof.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from periodic_manager.contracts import (
    ChangeSet,
    EntryRecord,
    ProviderSnapshot,
    RowError,
    StateReader,
)
from periodic_manager.engine.entries import Counted
from periodic_manager.engine.entry import ScheduledEntry, lookback_floor
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.pacing import in_turns
from periodic_manager.runtime.last_good import LastGoodKeeper
from periodic_manager.runtime.limited import limited, read_counted
from periodic_manager.runtime.publishing import EntryPublisher, error_record
from periodic_manager.runtime.tasks import reraise_if_cancelled
from periodic_manager.schedules.definition import PeriodicTaskConfig, content_hash, ident_of

log = logging.getLogger(__name__)

_LOOK_UP = object()


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
