"""The last good version of a row that turned bad, kept until the row is fixed or deleted, across
restarts and takeovers.

When a row a manager holds a good entry for turns bad, the sync keeps that entry running (nothing
is lost) and the :class:`LastGoodKeeper` stores it in the runtime store (``pm_last_good``), with
the revision at which the row was seen bad and since when it is kept. A manager that starts or
takes over (standbys sync too) and finds the row bad, with no entry of its own for it, reads the
stored version back, judges it like any row (it is data: nothing in it is trusted) and registers
it; the row error it publishes says that the last good version keeps running, and since when.

The stored version is forgotten when a sync sees the row good again, disabled or deleted. Several
managers read and write the same store, so a manager forgets only what its own view shows is
over: the row was seen not bad at a revision at least the one at which it was seen bad (a
standby whose sync read the row just before it turned bad leaves the version alone).

Store failures are logged and retried (a save at the next sync, a forget at the next full
reconcile); they never fail a sync.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from periodic_manager.contracts import (
    ChangeSet,
    LastGoodStore,
    LastGoodVersion,
    RowError,
    StateReader,
    StoredVersion,
)
from periodic_manager.engine.entries import Counted
from periodic_manager.errors import cause
from periodic_manager.pacing import in_turns
from periodic_manager.runtime.publishing import EntryPublisher
from periodic_manager.runtime.tasks import reraise_if_cancelled
from periodic_manager.schedules.definition import (
    UNKNOWN_START,
    PeriodicTaskConfig,
    content_hash,
    ident_of,
)

log = logging.getLogger(__name__)

SAVE_SLICE = 1000  # versions per store call (a bulk UPDATE may turn 100,000 rows bad at once)
Judge = Callable[[Sequence[Any]], PeriodicTaskConfig | RowError]


@dataclass(slots=True)
class _Kept:
    digest: str  # content hash of the version that runs
    since: datetime
    bad_revision: int | None


# The fields of a version that are its config's own, under the same names.
_CONTENT = ("name", "spec", "timezone", "anchor", "task_type", "payload_json", "options_json")


def version_of(
    entry: PeriodicTaskConfig, err: RowError, digest: str, since: datetime, manager_id: str
) -> LastGoodVersion:
    """The version of ``entry`` to store now that its row turned bad (``err``)."""
    effective = entry.effective_at if entry.effective_at is not UNKNOWN_START else None
    return LastGoodVersion(
        schedule_key=entry.key,
        effective_at=effective,
        content_hash=digest,
        row_revision=entry.revision,
        bad_revision=err.revision,
        since=since,
        manager_id=manager_id,
        **{field: getattr(entry, field) for field in _CONTENT},
    )


def _over(bad_revision: int | None, seen: int | None) -> bool:
    """Whether a row seen bad at ``bad_revision`` and seen not bad in a read at revision ``seen``
    (the change counter read before the rows) is over being bad."""
    return bad_revision is None or seen is None or bad_revision <= seen


class LastGoodKeeper:
    """Keeps, stores and restores last good versions for one manager's sync (see the module)."""

    def __init__(
        self,
        scheduler: Any,
        publisher: EntryPublisher,
        manager_id: str,
        *,
        store: LastGoodStore | None = None,
        judge: Judge | None = None,
        read_state: StateReader | None = None,
    ) -> None:
        """``store``: where versions are kept across restarts (None: in memory only); ``judge``:
        the provider's judge of a stored version (None: nothing is restored); ``read_state``:
        the runtime state of schedules, for a restored version with options.max_runs."""
        self.scheduler = scheduler
        self.publisher = publisher
        self.manager_id = manager_id
        self.store = store
        self.judge = judge
        self.read_state = read_state
        self.kept: dict[str, _Kept] = {}  # key -> the last good version this manager runs
        self.stored: dict[str, int | None] = {}  # key -> bad_revision of a stored version
        self._unsaved: dict[str, RowError] = {}  # saves that failed, retried at the next sync
        self._looked: set[str] = set()  # bad rows without an entry whose store was looked at
        self._refused: set[tuple[str, str]] = set()  # (key, stored reason) already logged
        # Partitions: whether this manager reads the row of an ident (a full read covers only
        # its partitions: a stored version of another's row is not over because it was unseen).
        self.scope: Callable[[int | str], bool] | None = None

    def since(self, key: str) -> datetime | None:
        """Since when this manager keeps the last good version of row ``key`` running, if it does."""
        kept = self.kept.get(key)
        if kept is None or self.scheduler.get(key) is None:
            return None
        return kept.since

    # -- after a sync ---------------------------------------------------------------------------

    async def after_full(
        self, errors: Sequence[RowError], revision: int | None, now: datetime
    ) -> None:
        """After a full reconcile: ``errors`` are every bad row, read after ``revision``."""
        bad = {str(e.schedule_id): e for e in errors}
        index = await self._index()
        if index is not None:
            self.stored = index
        scope = self.scope
        over = [
            k
            for k, b in self.stored.items()
            if k not in bad and _over(b, revision) and (scope is None or scope(ident_of(k)))
        ]
        await self._forget(over, revision)
        for key in [k for k in self.kept if k not in bad]:
            del self.kept[key]
        self._unsaved = {k: e for k, e in self._unsaved.items() if k in bad}
        self._looked &= bad.keys()
        await self._store_held(bad, now)
        await self._restore([k for k in bad if k in self.stored and self._unheld(k)], bad, now)

    async def after_changes(
        self, errors: Sequence[RowError], changes: ChangeSet, now: datetime
    ) -> None:
        """After an incremental sync: ``errors`` are the rows of ``changes`` found bad."""
        bad = {str(e.schedule_id): e for e in errors}
        watched = (self.stored.keys() | self.kept.keys()) - bad.keys()
        if watched:
            # Rows of this change set that are no longer bad: written good, disabled, deleted.
            idents = {ident_of(k): k for k in watched}
            over = {idents[c.ident] for c in changes.configs if c.ident in idents}
            over.update(k for k in changes.removed if k in watched)
            await self._forget(sorted(over), changes.revision)
            for key in over:
                self.kept.pop(key, None)
                self._unsaved.pop(key, None)
        self._looked.difference_update(changes.removed)
        await self._store_held(bad, now)
        # Bad rows this manager holds nothing for: once each, is a version stored (another
        # manager may have stored one since the last full reconcile)?
        fresh = [k for k in bad if k not in self._looked and self._unheld(k)]
        if fresh and self.store is not None:
            self._looked.update(fresh)
            index = await self._index()
            if index is not None:
                self.stored = index
            await self._restore([k for k in fresh if k in self.stored], bad, now)

    def _unheld(self, key: str) -> bool:
        entry = self.scheduler.get(key)
        return entry is None or not entry.synced

    async def _store_held(self, bad: Mapping[str, RowError], now: datetime) -> None:
        """Store the entries this manager holds for rows that turned bad (again: at a new
        revision), and retry the saves that failed."""
        saves: list[LastGoodVersion] = []
        errs = {**self._unsaved, **bad}
        async for part in in_turns(list(errs.items())):  # a bulk UPDATE turns 100,000 rows bad
            for key, err in part:
                entry = self.scheduler.get(key)
                if entry is None or not entry.synced:
                    self._unsaved.pop(key, None)
                    continue
                kept = self.kept.get(key)
                if (
                    kept is not None
                    and kept.bad_revision == err.revision
                    and key not in self._unsaved
                ):
                    continue  # stored already, as it is
                digest = content_hash(entry)
                since = kept.since if kept is not None and kept.digest == digest else now
                self.kept[key] = _Kept(digest, since, err.revision)
                saves.append(version_of(entry, err, digest, since, self.manager_id))
        await self._save(saves, errs)

    # -- the store --------------------------------------------------------------------------------

    async def _save(
        self, versions: Sequence[LastGoodVersion], errs: Mapping[str, RowError]
    ) -> None:
        if self.store is None or not versions:
            return
        for i in range(0, len(versions), SAVE_SLICE):
            part = versions[i : i + SAVE_SLICE]
            try:
                await self.store.save_last_good(part)
            except Exception as exc:  # kept running in memory; stored at the next sync
                reraise_if_cancelled(exc)
                log.warning(
                    "storing %d last good version(s) failed (retried): %s", len(part), cause(exc)
                )
                self._unsaved.update((v.schedule_key, errs[v.schedule_key]) for v in part)
                continue
            for v in part:
                self.stored[v.schedule_key] = v.bad_revision
                self._unsaved.pop(v.schedule_key, None)
            await asyncio.sleep(0)

    async def _index(self) -> dict[str, int | None] | None:
        if self.store is None:
            return None
        try:
            return await self.store.last_good_index()
        except Exception as exc:
            reraise_if_cancelled(exc)
            log.warning("reading the stored last good versions failed (retried): %s", cause(exc))
            return None

    async def _forget(self, keys: Sequence[str], revision: int | None) -> None:
        if not keys:
            return
        if self.store is not None:
            try:
                await self.store.forget_last_good(keys, revision)
            except Exception as exc:  # the next full reconcile forgets them
                reraise_if_cancelled(exc)
                log.warning("forgetting %d last good version(s) failed: %s", len(keys), cause(exc))
                return
        for key in keys:
            self.stored.pop(key, None)

    async def _restore(
        self, keys: Sequence[str], bad: Mapping[str, RowError], now: datetime
    ) -> None:
        """Run the stored versions of ``keys`` (bad rows this manager holds nothing for)."""
        if not keys or self.store is None or self.judge is None:
            return
        try:
            found = await self.store.load_last_good(keys)
            # options.max_runs: a restored version takes its runs left from what was recorded.
            states = await self.read_state(keys) if self.read_state is not None else {}
        except Exception as exc:  # the next full reconcile tries again
            reraise_if_cancelled(exc)
            log.warning(
                "reading %d last good version(s) failed (retried): %s", len(keys), cause(exc)
            )
            return
        async for part in in_turns(found):  # each one judged and registered
            for stored in part:
                err = bad.get(stored.schedule_key)
                if err is not None and self._unheld(stored.schedule_key):
                    st = states.get(stored.schedule_key)
                    self._run(stored, err, now, (st.runs, st.last_done_at) if st else (0, None))

    def _run(self, stored: StoredVersion, err: RowError, now: datetime, counted: Counted) -> None:
        """Judge a stored version as a row (the bad row's id, enabled) and register it if good."""
        key = stored.schedule_key
        assert self.judge is not None
        verdict = self.judge((err.schedule_id, True, *stored.raw))
        if isinstance(verdict, RowError):
            if (key, verdict.message) not in self._refused:
                self._refused.add((key, verdict.message))
                log.error(
                    "the stored last good version of schedule row %s (%s) cannot be used either: %s",
                    key,
                    err.name,
                    verdict.message,
                    extra={"schedule_id": key},
                )
            return
        try:
            entry = self.scheduler.register(verdict, synced=True, now=now, counted=counted)
        except Exception as exc:  # noqa: BLE001 - one schedule must never stop the sync
            reraise_if_cancelled(exc)
            log.error(
                "the stored last good version of schedule row %s cannot be scheduled: %s", key, exc
            )
            return
        self.publisher.upsert(entry)
        since = stored.since or now
        self.kept[key] = _Kept(content_hash(entry), since, stored.bad_revision)
        self.stored[key] = stored.bad_revision
        log.warning(
            "schedule row %s (%s) is unusable (%s); its last good version, kept since %s, runs instead",
            key,
            err.name,
            err.message,
            since.isoformat(),
            extra={"schedule": entry.name, "schedule_id": key},
        )
