"""Applying what the provider read to the scheduler: a full snapshot or the changes since.

A schedule whose content hash and name are unchanged keeps its entry and its timing; a changed
one is replaced (:meth:`Scheduler.register` keeps or carries its pending slot); a row deleted or
disabled loses its entry. A row the provider rejected is logged once per (row, content) and
published as an error record; if it had a good version before, that version keeps running
(nothing is lost), also after a restart or a takeover (:mod:`periodic_manager.runtime.last_good`). Long loops yield to the event loop, so a bulk change of 100,000 rows never
holds dispatch or the leadership proof.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from periodic_manager.contracts import ChangeSet, EntryRecord, ProviderSnapshot, RowError
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.runtime.last_good import LastGoodKeeper
from periodic_manager.runtime.publishing import EntryPublisher, error_record
from periodic_manager.schedules.definition import PeriodicTaskConfig, content_hash, ident_of

log = logging.getLogger(__name__)

YIELD_EVERY = 500  # rows between yields to the event loop while registering
SCAN_YIELD_EVERY = 20_000  # entries between yields in a pass that only looks them up
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


class Reconciler:
    """Keeps the scheduler's sync-owned entries equal to the provider's rows."""

    def __init__(
        self,
        scheduler: Scheduler,
        publisher: EntryPublisher,
        *,
        checked: Callable[[BaseException], None] = lambda exc: None,
    ) -> None:
        self.scheduler = scheduler
        self.publisher = publisher
        self._checked = checked  # re-raises a cancellation a driver disguised as its own error
        self.row_errors: dict[str, EntryRecord] = {}  # schedule key -> published error record
        self._logged: set[tuple[str, str]] = set()  # (schedule key, content hash) already logged
        # Stores the last good version of rows that turn bad, and runs the stored one of bad rows
        # this manager holds nothing for (set by the manager; None: kept in memory only).
        self.keeper: LastGoodKeeper | None = None

    async def apply_snapshot(self, snapshot: ProviderSnapshot, now: datetime) -> SyncReport:
        """Full reconcile: the snapshot is the whole truth."""
        report = SyncReport(ok=True, errors=list(snapshot.errors))
        # Every pass over all rows or entries yields now and then: with a million of them one
        # pass holds the event loop for a few hundred milliseconds.
        desired: dict[int | str, PeriodicTaskConfig] = {}
        for i, c in enumerate(snapshot.configs):
            desired[c.ident] = c
            if i % SCAN_YIELD_EVERY == SCAN_YIELD_EVERY - 1:
                await asyncio.sleep(0)
        bad = {ident_of(str(e.schedule_id)) for e in snapshot.errors}
        held = self.scheduler.held()
        for i, (ident, entry) in enumerate(list(held.items())):
            # A row that turned bad keeps its last good entry running (nothing is lost).
            if entry.synced and ident not in desired and ident not in bad:
                self._remove(ident, report)
            if i % SCAN_YIELD_EVERY == SCAN_YIELD_EVERY - 1:
                await asyncio.sleep(0)
        now_ = self.scheduler.clock.now()
        unchanged = 0
        for i, (ident, cfg) in enumerate(desired.items()):
            entry = held.get(ident)
            if entry is cfg:
                unchanged += 1  # the provider reused the config: the row did not change
            else:
                self._upsert(cfg, report, now_, entry)
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # let leadership checks and dispatch run
                now_ = self.scheduler.clock.now()
        report.unchanged += unchanged
        current = {str(e.schedule_id) for e in report.errors}
        if self.keeper is not None:
            await self.keeper.after_full(report.errors, snapshot.revision, now)
        self._publish_row_errors(report.errors, now)
        for key in list(self.row_errors):
            if key not in current:
                self.publisher.remove(self.row_errors.pop(key).entry_id)
        self._logged = {(k, h) for (k, h) in self._logged if k in current}
        return report

    async def apply_changes(self, changes: ChangeSet, now: datetime) -> SyncReport:
        """Incremental: only what changed since the last revision read."""
        report = SyncReport(ok=True, errors=list(changes.errors))
        for key in changes.removed:
            self._remove(key, report)
            self._clear_row_error(key)
        now_ = self.scheduler.clock.now()
        for i, cfg in enumerate(changes.configs):
            if self._upsert(cfg, report, now_):
                self._clear_row_error(cfg.key)
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                # A bulk INSERT of 100,000 rows arrives as one change set: dispatch and the
                # leadership proof must not wait for all of it.
                await asyncio.sleep(0)
                now_ = self.scheduler.clock.now()
        if self.keeper is not None:
            await self.keeper.after_changes(report.errors, changes, now)
        self._publish_row_errors(report.errors, now)
        return report

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
            new = self.scheduler.register(cfg, synced=True, now=now)
        except Exception as exc:  # noqa: BLE001 - one schedule must never stop the sync
            self._checked(exc)
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

    def _clear_row_error(self, key: str) -> None:
        rec = self.row_errors.pop(key, None)
        if rec is not None:
            self.publisher.remove(rec.entry_id)

    def _publish_row_errors(self, errors: Sequence[RowError], now: datetime) -> None:
        """Log each bad row once per content and publish it (visible through the API)."""
        for err in errors:
            key = str(err.schedule_id)
            since = self._kept_since(key)
            if (key, err.content_hash) not in self._logged:
                self._logged.add((key, err.content_hash))
                kept = " (its previous version keeps running)" if self.scheduler.get(key) else ""
                if since is not None:
                    kept = f" (its last good version keeps running, kept since {since.isoformat()})"
                log.error(
                    "schedule row %s (%s) rejected: %s%s", key, err.name, err.message, kept,
                    extra={"schedule": err.name, "schedule_id": key, "field": err.field},
                )
            rec = error_record(err.schedule_id, err.name, err.content_hash, err.message, now, since)
            old = self.row_errors.get(key)
            if old is None or old.entry_id != rec.entry_id or old.last_good_since != since:
                if old is not None:
                    self.publisher.remove(old.entry_id)
                self.row_errors[key] = rec
                self.publisher.upsert(rec)

    def _kept_since(self, key: str) -> datetime | None:
        """Since when the last good version of row ``key`` keeps running here (None: none does)."""
        if self.keeper is not None:
            return self.keeper.since(key)
        return None


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
