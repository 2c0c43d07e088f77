"""Entry publishing: what this manager holds, written to the runtime store for the API.

Publishing is for visibility only. A sync (or a cold start of a million entries) never waits for
it: changes are queued by entry id and a background task writes them, coalescing what was queued
meanwhile; records are built when written, so a cold start does not allocate a record per entry
on its way. When the store fails, the manager republishes everything at its next heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from periodic_manager import gcpolicy
from periodic_manager.contracts import EntryRecord, RuntimeStore
from periodic_manager.errors import cause
from periodic_manager.pacing import in_turns
from periodic_manager.runtime.tasks import reraise_if_cancelled
from periodic_manager.schedules.definition import content_hash

if TYPE_CHECKING:
    from periodic_manager.engine.entry import ScheduledEntry

log = logging.getLogger(__name__)

# Entries per write (one transaction), built just before it is sent: large enough that a write's
# own cost (a transaction, a staging table on PostgreSQL) is small beside its rows', small enough
# that the two slices alive at once (one written, the next built) are a small peak: the allocator
# keeps a peak's memory for good once anything long-lived lands beside it. bench/lean.py, 10,000
# schedules at rest: 5000 kept ~2 MB more than 2500; at 100,000 the CPU to publish was the same
# (1000: +20 %, and the quiet after a start later).
SLICE = 2500


def entry_record(entry: ScheduledEntry, view: Any = None) -> EntryRecord:
    """The published record of ``entry``; ``view``: its :class:`~periodic_manager.engine.overlap.View`
    (options.overlap skip and hold), if any."""
    cfg = entry.config
    key, digest = cfg.key, content_hash(cfg)
    # Positional, in EntryRecord's field order: a cold start builds one per entry, and keywords
    # would double the cost of the tuple.
    fields = (
        f"{key}-{digest[:12]}",
        key,
        cfg.name,
        digest,
        "active",
        entry.registered_at,
        cfg.spec,
        cfg.timezone,
        cfg.anchor,
        cfg.task_type,
        cfg.queue,
    )
    if view is None:
        return EntryRecord(*fields)
    return EntryRecord(
        *fields, None, view.held_slot, view.previous_task_id, view.previous_task_state
    )


class EntryPublisher:
    """Queues entry changes (by entry id) and writes them to ``store`` in the background."""

    def __init__(
        self,
        store: RuntimeStore,
        manager_id: str,
        *,
        on_failure: Callable[[BaseException], None],
        quiet: Callable[[], Awaitable[None]] | None = None,
        between: Callable[[], Awaitable[None]] | None = None,
        views: Callable[[int | str], Any] = lambda ident: None,
    ) -> None:
        self.store = store
        self.manager_id = manager_id
        self._on_failure = on_failure  # the store failed: republish at the next heartbeat
        # Entries by ident (their ids and records are computed when written: a cold start
        # hashes nothing on its way), and error records or removals by entry id.
        self._entries: dict[int | str, ScheduledEntry] = {}
        self._records: dict[str, EntryRecord | None] = {}  # None: removed
        self._ready = asyncio.Event()
        self._lock = asyncio.Lock()
        # ident -> the schedule's overlap view (the scheduler's OverlapGuard).
        self.views = views
        self._quiet = quiet  # awaited before each write: a sync under way goes first
        # Awaited before each slice of a write: a dispatch under way goes first (a million
        # entries take seconds to publish; a slot due meanwhile must not wait behind them).
        self._between = between

    def upsert(self, item: ScheduledEntry | EntryRecord) -> None:
        """Publish an entry (its record is built when written) or an error record."""
        if isinstance(item, EntryRecord):
            self._records[item.entry_id] = item
        else:
            self._entries[item.ident] = item
        self._ready.set()

    def remove(self, entry_id: str) -> None:
        self._records[entry_id] = None
        self._ready.set()

    async def run(self) -> None:
        while True:
            await self._ready.wait()
            if self._quiet is not None:
                await self._quiet()  # a cold start registers first, then publishes
            self._ready.clear()
            await self.flush()

    async def discard(self) -> None:
        """Drop what is queued and wait for a write under way (a stopping manager: its rows go
        with its manager row, so writing them first would only be undone; a stop during a
        large takeover queued a million removals and upserts, minutes of writes)."""
        self._entries.clear()
        self._records.clear()
        self._ready.clear()
        async with self._lock:
            pass

    async def flush(self) -> None:
        """Write what is queued now (and wait for a write under way).

        Entries go out in slices of SLICE, each built just before it is written: publishing a
        cold start's million entries never holds a million records (nor the event loop)."""
        async with self._lock:  # the whole write: a flush under way is waited for, to its end
            if not self._entries and not self._records:
                return
            entries, self._entries = self._entries, {}
            records, self._records = self._records, {}
            live: list[ScheduledEntry] = []  # the dead (superseded) are left out
            async for queued in in_turns(list(entries.values())):
                live.extend(entry for entry in queued if not entry.dead)
            del entries
            # Removed ids written again (an entry id removed and then written again stays): only
            # those are remembered, not every id written (a cold start writes a million).
            gone = dict.fromkeys(eid for eid, rec in records.items() if rec is None)
            written = {r.entry_id for r in records.values() if r is not None and r.entry_id in gone}
            # Canonical payloads (kept for good) first, side by side in memory; the records (gone
            # once written) after: mixing the two leaves the allocator's pools pinned half-empty.
            async for some in in_turns(live):
                for entry in some:
                    entry.payload_json  # noqa: B018
            # Each slice is built while the database takes the one before (one write at a time).
            sending: asyncio.Task[None] | None = None
            try:
                for i in range(0, len(live), SLICE):
                    # Built in turns: a store that answers at once (in memory) must not let a
                    # million records hold the event loop either.
                    part: list[EntryRecord] = []
                    async for some in in_turns(live[i : i + SLICE]):
                        part.extend([entry_record(e, self.views(e.ident)) for e in some])
                    if gone:
                        written.update(rec.entry_id for rec in part if rec.entry_id in gone)
                    if sending is not None:
                        await sending
                    if self._between is not None:
                        await self._between()
                    sending = asyncio.ensure_future(self._write(part))
                    del part
                if sending is not None:
                    await sending
            finally:
                if sending is not None and not sending.done():  # cancelled: so is the write
                    sending.cancel()
                    await asyncio.gather(sending, return_exceptions=True)
            # Error records, then removals (an id removed and then written again stays).
            upserts = [rec for rec in records.values() if rec is not None]
            removed = [eid for eid in gone if eid not in written]
            if upserts or removed:
                await self.call(
                    self.store.apply_entries(self.manager_id, upserts, removed),
                    "publishing entries",
                )
        if len(live) >= SLICE:
            gcpolicy.release()

    async def _write(self, part: list[EntryRecord]) -> None:
        # The store's call is made here, in the task: a task cancelled before it ran (a stop
        # right after start) leaves no call made and never awaited.
        await self.call(self.store.apply_entries(self.manager_id, part, []), "publishing entries")

    async def call(self, op: Awaitable[object], what: str) -> None:
        """Await a store call; a failure is logged and marks everything for republishing."""
        try:
            await op
        except Exception as exc:  # the store is for visibility; scheduling goes on without it
            reraise_if_cancelled(exc)
            log.warning("%s failed (republished at the next heartbeat): %s", what, cause(exc))
            self._on_failure(exc)


def error_record(
    schedule_id: object,
    name: str | None,
    content_hash: str,
    message: str,
    now: datetime,
    last_good_since: datetime | None = None,
) -> EntryRecord:
    """A rejected row as published: ``status`` error, why in ``last_error``; ``last_good_since``:
    since when this manager keeps the row's last good version running (None: none runs)."""
    return EntryRecord(
        entry_id=f"{schedule_id}-error-{content_hash[:12]}",
        schedule_key=str(schedule_id),
        name=name,
        content_hash=content_hash,
        status="error",
        registered_at=now,
        last_error=message,
        last_good_since=last_good_since,
    )
