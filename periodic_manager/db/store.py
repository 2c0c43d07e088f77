"""The RuntimeStore on PostgreSQL and SQLite: ``pm_managers``, ``pm_entries``, ``pm_schedule_state``
and the run history ``pm_runs``.

Writes are shaped for a manager holding many schedules: a heartbeat updates one row, entries are
written only when they change, and a batch of slot outcomes is folded in Python per schedule and
written with one ``INSERT .. ON CONFLICT DO UPDATE`` (executemany), so the cost of a batch does
not grow with round trips per run.

Errors: SQLAlchemy (and driver) exceptions propagate unchanged. The manager wraps every store
call in ``except Exception``, logs and carries on scheduling; the API's read helpers let them
reach its error handler. The one domain error is :class:`~periodic_manager.errors.NotFoundError`
from :meth:`DatabaseRuntimeStore.heartbeat` when the manager's row is gone (it was reaped), so the
manager knows to register again.

Entries go with their manager through ``ON DELETE CASCADE``; on SQLite that needs
``PRAGMA foreign_keys=ON``, which :func:`periodic_manager.db.engine.create_engine` sets on every
connection. Use that function to build the engine.

History (``pm_runs``, :mod:`periodic_manager.db.history`): every batch of runs is also inserted
there, in the same transaction as the state upsert. It is bounded two ways by :meth:`prune_runs`:
rows older than ``runs_retention`` go, and each schedule written since the last prune keeps only
its newest ``runs_per_schedule`` rows. The manager's heartbeat runs the prune, at most once per
``prune_interval`` and off the enqueue path (once per ``idle_prune_interval`` while this manager
records no runs: at rest, what is left to prune only ages out, over days); a failing prune is
logged and never fails the heartbeat. What every manager would delete alike (rows past
``runs_retention``, the change history) is pruned only by the manager whose heartbeat says it
does the shared work (``ManagerStatus.shared_work``: with ``PM_COORDINATION=partitions``, the
holder of partition 0); each keeps trimming the schedules it wrote itself.

The change history (``pm_schedule_changes``, :mod:`periodic_manager.db.change_history`, written
by triggers) is bounded by the same prune: entries older than ``changes_retention`` go, and each
schedule keeps its newest ``changes_per_schedule``.

The API reads what managers published through the store's read side,
:mod:`periodic_manager.db.store_reads`, which :meth:`DatabaseRuntimeStore.get_state` uses too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Interval,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    literal_column,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager import gcpolicy
from periodic_manager.contracts import (
    SENT,
    EntryRecord,
    FailureCount,
    LastGoodVersion,
    ManagerInfo,
    ManagerStatus,
    RunRecord,
    StateRecord,
    StoredVersion,
)
from periodic_manager.db import backfill_slots, change_history, history, last_good, store_reads
from periodic_manager.db.engine import backend, chunks, on_sqlite
from periodic_manager.db.models import entries_table, managers_table, schedule_state_table
from periodic_manager.db.store_reads import COUNT_COLUMNS
from periodic_manager.db.upsert import upsert
from periodic_manager.errors import NotFoundError
from periodic_manager.pacing import in_turns

_UPSERT_CHUNK = 5000  # entry rows per executemany
_STATE_UPSERT_CHUNK = 1000  # state rows per statement (each is built and bound in one go)
# A prune of at least this many schedules' history follows a burst: memory is given back after it.
RELEASE_AFTER_KEYS = 1000
_STREAM_ROWS = 5000  # rows fetched per round trip when a read is streamed

log = logging.getLogger(__name__)


class DatabaseRuntimeStore:
    """:class:`~periodic_manager.contracts.RuntimeStore` backed by the schedule database."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        runs_retention: timedelta | None = timedelta(days=7),
        runs_per_schedule: int = 100,
        prune_interval: timedelta = timedelta(minutes=1),
        changes_retention: timedelta | None = timedelta(days=90),
        changes_per_schedule: int = 1000,
        idle_prune_interval: timedelta = timedelta(minutes=10),
        server_clock: bool | None = None,
    ) -> None:
        """``runs_retention``: history rows older than this are pruned (None: no age limit);
        ``runs_per_schedule``: newest rows kept per schedule (0: no history is written);
        ``changes_retention`` and ``changes_per_schedule``: the same for the change history;
        ``prune_interval``: the heartbeat prunes at most this often, and every
        ``idle_prune_interval`` when this manager recorded no run since the last prune;
        ``server_clock`` (default: on PostgreSQL): the managers' heartbeats and their liveness
        on the database's clock (False: the instants the manager gives, as on SQLite)."""
        if runs_per_schedule < 0:
            raise ValueError("runs_per_schedule must be >= 0")
        if changes_per_schedule < 1:
            raise ValueError("changes_per_schedule must be >= 1")
        self.engine = engine
        self.runs_retention = runs_retention
        self.runs_per_schedule = runs_per_schedule
        self.prune_interval = prune_interval
        self.idle_prune_interval = max(prune_interval, idle_prune_interval)
        self.changes_retention = changes_retention
        self.changes_per_schedule = changes_per_schedule
        self._touched: set[str] = set()  # schedule keys with history written since the last prune
        self._last_prune_at: datetime | None = None
        dialect = backend(engine)
        self._copy = dialect == "postgresql" and engine.dialect.driver == "asyncpg"
        # The heartbeat on PostgreSQL: one statement, sent by the driver of a pooled connection
        # (no transaction around it, none of SQLAlchemy's work per statement: a third of the
        # cost of a beat, every 5 s of a manager at rest).
        self._beat_pg = self._copy
        # Liveness on the database's clock (PostgreSQL, where managers share work): a manager's
        # heartbeat_at is the server's now(), and a manager is dead when silent for so long on
        # that clock, never by comparing two managers' clocks (issue 36: 15 s apart, they reaped
        # each other alive). SQLite is a file of this host: its clock is the host's.
        self._server_clock = dialect == "postgresql" and server_clock is not False
        if dialect not in ("postgresql", "sqlite", "mysql"):
            raise ValueError(
                f"unsupported database {dialect!r}: use postgresql, mysql/mariadb or sqlite"
            )

    # -- writes (the manager) ------------------------------------------------------------------

    async def register_manager(self, info: ManagerInfo, status: ManagerStatus) -> None:
        """Create or replace the manager's row and drop any entries it had published before."""
        values = {
            "manager_id": info.manager_id,
            "hostname": info.hostname,
            "pid": info.pid,
            "version": info.version,
            "started_at": info.started_at,
            **_status_values(status),
        }
        if self._server_clock:  # liveness on the database's clock (started_at stays this one's)
            values["heartbeat_at"] = func.now()
        stmt = upsert(
            self.engine,
            managers_table,
            ["manager_id"],
            lambda new: [(k, new[k]) for k in values if k != "manager_id"],
        ).values(values)
        async with self.engine.begin() as conn:
            await conn.execute(stmt)
            await conn.execute(
                delete(entries_table).where(entries_table.c.manager_id == info.manager_id)
            )

    async def heartbeat(
        self, manager_id: str, status: ManagerStatus, *, reap_before: datetime | None = None
    ) -> int:
        """Update the manager's row (one UPDATE) and, with ``reap_before``, count the other
        managers whose heartbeat is older: one checkout and one commit per beat (on PostgreSQL
        one statement in autocommit: a single round trip, the cost of a manager at rest). The
        count is returned: the caller removes them apart (:meth:`reap`), so that a dead
        manager's entries, however many, never weigh on a heartbeat. NotFoundError if the row
        is gone (reaped). The statements are :func:`beat_statements` (on PostgreSQL folded into
        one, :data:`BEAT_PG`). The history prune is not run here: the caller runs :meth:`beaten`
        after it, apart (a long prune must not delay the next beat)."""
        params = beat_params(manager_id, status, reap_before, server_clock=self._server_clock)
        if self._beat_pg:
            async with self.engine.connect() as conn:
                driver = (await conn.get_raw_connection()).driver_connection
                assert driver is not None
                sql = BEAT_PG if self._server_clock else BEAT_PG_LOCAL
                beaten, dead = await driver.fetchrow(sql, *params.values())
        else:
            beat, due = beat_statements(server_clock=self._server_clock)
            async with self.engine.begin() as conn:
                beaten = (await conn.execute(beat, params)).rowcount
                counted = beaten and reap_before is not None
                dead = (await conn.execute(due, params)).scalar_one() if counted else 0
        if not beaten:
            raise NotFoundError(manager_id)
        return int(dead)

    async def server_now(self) -> datetime | None:
        """The database's now() on PostgreSQL (contracts.ServerClock); None elsewhere."""
        if not self._server_clock:
            return None
        async with self.engine.connect() as conn:
            answer: datetime = (await conn.execute(select(func.now()))).scalar_one()
        return answer

    @property
    def carries_beat(self) -> bool:
        """Whether a statement of this manager's own on the same PostgreSQL database (a lease
        round, :mod:`periodic_manager.runtime.partitions`) can write the heartbeat: its
        :func:`beat_ctes`, with :func:`beat_params`, then :meth:`beaten` (on the database's
        clock)."""
        return self._beat_pg and self._server_clock

    def beat_values(
        self, manager_id: str, status: ManagerStatus, reap_before: datetime | None
    ) -> tuple[Any, ...]:
        """The parameters of :func:`beat_ctes` (a heartbeat carried by another statement)."""
        return tuple(beat_params(manager_id, status, reap_before, server_clock=True).values())

    async def beaten(self, status: ManagerStatus) -> None:
        """What follows a heartbeat written (here or carried by another statement): the history
        prune when it is due (at most every ``prune_interval``; a no-op otherwise)."""
        await self._maybe_prune(status.heartbeat_at, shared=status.shared_work)

    def prune_due(self, now: datetime) -> bool:
        """Whether :meth:`beaten` at ``now`` would do more than note the time (the first beat
        sets the timer)."""
        if self._last_prune_at is None:
            return True
        every = self.prune_interval if self._touched else self.idle_prune_interval
        return now >= self._last_prune_at + every

    async def _maybe_prune(self, now: datetime, *, shared: bool) -> None:
        # The first heartbeat only sets the timer: a prune never delays a manager's start.
        if self._last_prune_at is None:
            self._last_prune_at = now
            return
        if not self.prune_due(now):
            return
        self._last_prune_at = now
        try:
            removed = await self.prune_runs(now, shared=shared)
        except Exception as exc:  # history is housekeeping: never fail the heartbeat for it
            log.warning("pruning run history failed (retried later): %s", exc)
        else:
            if removed:
                log.debug("pruned %d history row(s)", removed)
        if not shared:
            return  # another manager prunes the change history
        try:
            removed = await self.prune_changes(now)
        except Exception as exc:
            log.warning("pruning change history failed (retried later): %s", exc)
            return
        if removed:
            log.debug("pruned %d change history row(s)", removed)

    async def apply_entries(
        self, manager_id: str, upserts: Sequence[EntryRecord], removed: Sequence[str]
    ) -> None:
        """Delete ``removed`` entry ids and insert or replace ``upserts``, in one transaction.

        The manager's row must exist (foreign key); an id both removed and upserted ends up
        present, as in the memory store.
        """
        if not upserts and not removed:
            return
        async with self.engine.begin() as conn:
            for chunk in chunks(removed):
                await conn.execute(
                    delete(entries_table).where(
                        entries_table.c.manager_id == manager_id,
                        entries_table.c.entry_id.in_(chunk),
                    )
                )
            if upserts and self._copy:
                await self._upsert_entries_pg(conn, manager_id, upserts)
            elif upserts:
                stmt = upsert(
                    self.engine,
                    entries_table,
                    ["manager_id", "entry_id"],
                    lambda new: [
                        (c.name, new[c.name])
                        for c in entries_table.c
                        if c.name not in ("manager_id", "entry_id")
                    ],
                )
                # In slices, each built just before it is sent: every statement stays well inside
                # the driver's command timeout, and the event loop is never held for long, even
                # when a cold start publishes 100,000 entries.
                for i in range(0, len(upserts), _UPSERT_CHUNK):
                    rows = [_entry_values(manager_id, r) for r in upserts[i : i + _UPSERT_CHUNK]]
                    await conn.execute(stmt, rows)

    async def _upsert_entries_pg(
        self, conn: AsyncConnection, manager_id: str, upserts: Sequence[EntryRecord]
    ) -> None:
        """PostgreSQL with asyncpg: ``upserts`` copied (binary COPY) into a table of this
        transaction, then merged in one statement. The values skip SQLAlchemy's per-row parameter
        processing, the cost that kept a manager busy for seconds after a cold start while it
        published its 100,000 entries."""
        await conn.execute(text(_ENTRY_STAGE))  # through SQLAlchemy: its transaction begins
        raw = await conn.get_raw_connection()
        mine = (manager_id,)
        for i in range(0, len(upserts), _UPSERT_CHUNK):  # a republication of everything in slices
            # A record is the row (its fields in _ENTRY_COPIED's order), after the manager id,
            # made as COPY encodes it (a list of them would double the publisher's peak).
            records = (
                mine + r
                if r.previous_task_id is None or 0 < len(r.previous_task_id) <= _TASK_ID
                else mine + r._replace(previous_task_id=r.previous_task_id[:_TASK_ID] or None)
                for r in upserts[i : i + _UPSERT_CHUNK]
            )
            await raw.driver_connection.copy_records_to_table(  # type: ignore[union-attr]
                _ENTRY_STAGED, records=records, columns=_ENTRY_COPIED
            )
        await conn.execute(text(_ENTRY_MERGE))

    async def record_runs(self, runs: Sequence[RunRecord]) -> None:
        """Fold a batch of runs into ``pm_schedule_state``: one statement per batch.

        Each schedule's runs are first folded in Python with :meth:`StateRecord.fold` into a
        fresh record (the batch's delta); the upsert then merges that delta into the stored row
        with the same rules, so the result equals folding every run one by one.
        """
        if not runs:
            return
        # The Python side of a burst's history (folding, building rows) takes turns with the
        # other tasks: the next instant's dispatch must not wait on it.
        deltas: dict[str, StateRecord] = {}
        updated_at: dict[str, datetime] = {}
        async for turn in in_turns(runs):
            for run in turn:
                delta = deltas.setdefault(run.schedule_key, StateRecord(run.schedule_key, run.name))
                delta.fold(run)
                updated_at[run.schedule_key] = max(run.at, updated_at.get(run.schedule_key, run.at))
        # Sorted so that concurrent writers lock rows in the same order (no deadlock).
        keys = sorted(deltas)
        async with self.engine.begin() as conn:
            limited = [k for k in keys if deltas[k].runs]
            if limited:  # options.max_runs: count each slot once, against the stored settled slot
                await self._count_runs(conn, limited, runs, deltas)
            upsert = self._state_upsert()
            for i in range(0, len(keys), _STATE_UPSERT_CHUNK):  # slices: within the command timeout
                part = keys[i : i + _STATE_UPSERT_CHUNK]
                await conn.execute(upsert, [_state_values(deltas[k], updated_at[k]) for k in part])
            if self.runs_per_schedule:
                await history.write(conn, runs, copy=self._copy)
        if self.runs_per_schedule:
            self._touched.update(deltas)

    async def _count_runs(
        self, conn: Any, keys: list[str], runs: Sequence[RunRecord], deltas: dict[str, StateRecord]
    ) -> None:
        """Set the delta's ``runs`` of each limited schedule in ``keys`` to its distinct slots
        recorded sent after the stored settled slot (read under a row lock on PostgreSQL, in
        the transaction that moves it): a slot found duplicate after a takeover, or recorded by
        two managers, counts once."""
        t = schedule_state_table.c
        done: dict[str, datetime | None] = {}
        for chunk in chunks(keys):
            stmt = select(t.schedule_key, t.last_done_at).where(t.schedule_key.in_(chunk))
            if not on_sqlite(self.engine):
                stmt = stmt.with_for_update()
            done.update((k, at) for k, at in (await conn.execute(stmt)).all())
        wanted = set(keys)
        slots: dict[str, set[datetime]] = {}
        for run in runs:
            key = run.schedule_key
            if run.limited and run.status in SENT and key in wanted:
                at = done.get(key)
                if at is None or run.slot > at:
                    slots.setdefault(key, set()).add(run.slot)
        for key in keys:
            deltas[key].runs = len(slots.get(key, ()))

    async def prune_runs(
        self, now: datetime, keys: Iterable[str] | None = None, *, shared: bool = True
    ) -> int:
        """Apply the history bounds; returns the number of rows deleted.

        Rows with ``at`` older than ``now - runs_retention`` are deleted in bounded batches (see
        :func:`periodic_manager.db.history.drop_old`; only with ``shared``: the work done once,
        by one manager). Then every schedule in ``keys`` (default: those written since the last
        prune, by this manager) keeps its newest ``runs_per_schedule`` rows.
        """
        removed = 0
        if shared and self.runs_retention is not None:
            removed += await history.drop_old(self.engine, now - self.runs_retention)
            # What backfills sent is kept as long, whatever the cap per schedule below.
            removed += await backfill_slots.drop_old(self.engine, now - self.runs_retention)
        if keys is not None:
            return removed + await history.cap(self.engine, keys, self.runs_per_schedule)
        touched, self._touched = self._touched, set()
        removed += await history.cap(self.engine, touched, self.runs_per_schedule)
        if len(touched) >= RELEASE_AFTER_KEYS:
            # The key of every schedule of a burst, kept since: the last of what it held.
            del touched
            gcpolicy.release()
        return removed

    async def prune_changes(self, now: datetime) -> int:
        """Apply the change history's bounds (entries older than ``now - changes_retention``,
        beyond the newest ``changes_per_schedule`` of a schedule); the number deleted."""
        removed = 0
        if self.changes_retention is not None:
            removed += await change_history.drop_old(self.engine, now - self.changes_retention)
        return removed + await change_history.cap(self.engine, self.changes_per_schedule)

    def _state_upsert(self) -> Any:
        t = schedule_state_table.c
        return upsert(
            self.engine, schedule_state_table, ["schedule_key"], lambda new: _state_assign(t, new)
        )

    async def unregister_manager(self, manager_id: str) -> None:
        """Remove the manager; its entries go with it (ON DELETE CASCADE)."""
        async with self.engine.begin() as conn:
            await conn.execute(
                delete(managers_table).where(managers_table.c.manager_id == manager_id)
            )

    async def reap(self, older_than: datetime, *, silence: timedelta | None = None) -> int:
        """Remove managers whose heartbeat is older than ``older_than`` and their entries (on
        PostgreSQL, with ``silence``: silent for longer than it on the database's clock). A
        dead manager may have published hundreds of thousands: they go in short transactions
        of REAP_CHUNK (each a moment's lock), then its row (whatever entries are left go with
        it, ON DELETE CASCADE). A manager that comes back meanwhile loses its row too: it
        finds it gone at its next heartbeat and publishes itself and its entries again."""
        m, e = managers_table.c, entries_table.c
        cutoff: Any = older_than
        if self._server_clock and silence is not None:
            cutoff = func.now() - cast(bindparam("silence", silence, type_=Interval), Interval)
        async with self.engine.connect() as conn:
            dead = list(
                (
                    await conn.execute(
                        select(m.manager_id).where(m.heartbeat_at < cutoff).limit(REAP_MANAGERS)
                    )
                ).scalars()
            )
        removed = 0
        for manager_id in dead:
            while True:
                deleted = 0
                async with self.engine.begin() as conn:
                    ids = list(
                        (
                            await conn.execute(
                                select(e.entry_id)
                                .where(e.manager_id == manager_id)
                                .limit(REAP_CHUNK)
                            )
                        ).scalars()
                    )
                    for part in chunks(ids):
                        deleted += (
                            await conn.execute(
                                delete(entries_table).where(
                                    e.manager_id == manager_id, e.entry_id.in_(part)
                                )
                            )
                        ).rowcount
                # A chunk that removed nothing (ids the database does not match back as read)
                # ends the loop: the manager's row below takes whatever is left with it.
                if len(ids) < REAP_CHUNK or not deleted:
                    break
            async with self.engine.begin() as conn:
                result = await conn.execute(
                    delete(managers_table).where(m.manager_id == manager_id)
                )
            removed += int(result.rowcount)
        return removed

    # -- options.pause_after_failures (periodic_manager.runtime.failures) ----------------------

    async def failure_count(self, schedule_key: str, limit: int) -> FailureCount:
        """The stored count and the sent runs after it; see
        :func:`periodic_manager.db.store_reads.failure_count`."""
        async with self.engine.connect() as conn:
            return await store_reads.failure_count(conn, schedule_key, limit)

    async def save_failure_count(
        self, schedule_key: str, failures: int, checked_at: datetime
    ) -> None:
        """Store the count up to the run of slot ``checked_at``, only forward."""
        t = schedule_state_table.c
        stmt = (
            update(schedule_state_table)
            .where(
                t.schedule_key == schedule_key,
                or_(t.failures_checked_at.is_(None), t.failures_checked_at < checked_at),
            )
            .values(consecutive_failures=failures, failures_checked_at=checked_at)
        )
        async with self.engine.begin() as conn:
            await conn.execute(stmt)

    async def reset_failure_count(self, schedule_key: str) -> None:
        """Count from 0 again (the schedule was paused for its failures)."""
        t = schedule_state_table.c
        stmt = (
            update(schedule_state_table)
            .where(t.schedule_key == schedule_key)
            .values(consecutive_failures=0)
        )
        async with self.engine.begin() as conn:
            await conn.execute(stmt)

    # -- reads (the manager's) -----------------------------------------------------------------

    async def get_state(self, schedule_keys: Iterable[str]) -> dict[str, StateRecord]:
        """Stored state of the given schedules (absent keys are simply missing); see
        :func:`periodic_manager.db.store_reads.states`."""
        async with self.engine.connect() as conn:
            return await store_reads.states(conn, schedule_keys)

    async def settled_after(self, since: datetime) -> dict[str, datetime]:
        """The latest settled slot of each schedule settled after ``since`` (read once per
        takeover, in slices)."""
        t = schedule_state_table.c
        stmt = select(t.schedule_key, t.last_done_at).where(t.last_done_at > since)
        async with self.engine.connect() as conn:
            result = await conn.stream(stmt.execution_options(yield_per=_STREAM_ROWS))
            out: dict[str, datetime] = {}
            async for part in result.partitions():
                out.update((key, at) for key, at in part)
                await asyncio.sleep(0)
        return out

    # -- last good versions (periodic_manager.runtime.last_good; SQL in db/last_good.py) ----------------

    async def save_last_good(self, versions: Sequence[LastGoodVersion]) -> None:
        """Store the last good version of rows that turned bad (see ``db.last_good.save``)."""
        await last_good.save(self.engine, versions)

    async def last_good_index(self) -> dict[str, int | None]:
        """Keys with a stored last good version, each with the revision it was seen bad at."""
        return await last_good.index(self.engine)

    async def load_last_good(self, keys: Sequence[str]) -> list[StoredVersion]:
        """The stored last good versions of ``keys``, raw (to be judged like a row)."""
        return await last_good.load(self.engine, keys)

    async def forget_last_good(self, keys: Sequence[str], revision: int | None) -> None:
        """Delete the versions of ``keys`` seen bad at or before ``revision`` (None: any)."""
        await last_good.forget(self.engine, keys, revision)


# -- row <-> record ------------------------------------------------------------------------------


def _status_values(status: ManagerStatus) -> dict[str, Any]:
    return {
        "heartbeat_at": status.heartbeat_at,
        "is_leader": status.is_leader,
        "last_sync_at": status.last_sync_at,
        "last_sync_error": status.last_sync_error,
        "entry_count": status.entry_count,
        "target_down": status.target_down,
        "clock_offset_s": status.clock_offset_s,
    }


# The cold-start path of apply_entries on PostgreSQL: COPY into a table dropped at commit, then
# one INSERT .. ON CONFLICT from it (COPY alone cannot replace a row already there).
_ENTRY_COLUMNS = tuple(c.name for c in entries_table.c)
# The columns of a copied row: the manager id, then an EntryRecord's fields.
_ENTRY_COPIED = (
    "manager_id",
    *("held_slot_at" if f == "held_slot" else f for f in EntryRecord._fields),
)
assert sorted(_ENTRY_COPIED) == sorted(_ENTRY_COLUMNS), "pm_entries and EntryRecord disagree"
_TASK_ID: int = entries_table.c.previous_task_id.type.length  # type: ignore[attr-defined]  # cut to it
_ENTRY_STAGED = "pm_entries_in"
_ENTRY_STAGE = f"CREATE TEMP TABLE {_ENTRY_STAGED} (LIKE {entries_table.name}) ON COMMIT DROP"
_ENTRY_MERGE = (
    f"INSERT INTO {entries_table.name} SELECT * FROM {_ENTRY_STAGED}"
    " ON CONFLICT (manager_id, entry_id) DO UPDATE SET "
    + ", ".join(
        f"{c} = EXCLUDED.{c}" for c in _ENTRY_COLUMNS if c not in ("manager_id", "entry_id")
    )
)


def _entry_values(manager_id: str, rec: EntryRecord) -> dict[str, Any]:
    return {
        "manager_id": manager_id,
        "entry_id": rec.entry_id,
        "schedule_key": rec.schedule_key,
        "name": rec.name,
        "content_hash": rec.content_hash,
        "status": rec.status,
        "spec": rec.spec,
        "timezone": rec.timezone,
        "anchor": rec.anchor,
        "task_type": rec.task_type,
        "queue": rec.queue,
        "last_error": rec.last_error,
        "registered_at": rec.registered_at,
        "held_slot_at": rec.held_slot,
        "previous_task_id": rec.previous_task_id[:_TASK_ID] if rec.previous_task_id else None,
        "previous_task_state": rec.previous_task_state,
        "last_good_since": rec.last_good_since,
    }


def _state_values(delta: StateRecord, updated_at: datetime) -> dict[str, Any]:
    values: dict[str, Any] = {
        "schedule_key": delta.schedule_key,
        "name": delta.name,
        "last_slot_at": delta.last_slot_at,
        "last_done_at": delta.last_done_at,
        "last_enqueued_at": delta.last_enqueued_at,
        "last_message_id": delta.last_message_id,
        "last_status": delta.last_status,
        "last_error": delta.last_error,
        "updated_at": updated_at,
    }
    for status, col in COUNT_COLUMNS.items():
        values[col] = delta.counts.get(status, 0)
    values["runs_count"] = delta.runs
    return values


def _state_assign(t: Any, new: Any) -> list[tuple[str, Any]]:
    """The columns of a schedule's state merged with a batch's delta ``new``; ``last_slot_at``,
    which the conditions of others read, is assigned last (db/upsert.py)."""
    # The batch moved the last slot iff it had an enqueued/duplicate run (then the delta's
    # last_slot_at is set); like StateRecord.fold, an equal slot replaces (the later run wins).
    moves = and_(
        new.last_slot_at.is_not(None),
        or_(t.last_slot_at.is_(None), new.last_slot_at >= t.last_slot_at),
    )
    # The batch decided last_error iff it had an enqueued, duplicate or failed run: the
    # delta then holds the outcome of the last one (None clears); skipped runs leave it.
    # (No bound parameter in the update part: asyncmy's executemany cannot take one there.)
    decides_error = (
        new.enqueued_count + new.duplicate_count + new.resent_count + new.failed_count
    ) > literal_column("0")
    set_: list[tuple[str, Any]] = [
        ("name", new.name),
        ("last_status", new.last_status),
        ("updated_at", new.updated_at),
        # The latest settled slot only ever moves forward.
        (
            "last_done_at",
            case(
                (
                    and_(
                        new.last_done_at.is_not(None),
                        or_(t.last_done_at.is_(None), new.last_done_at > t.last_done_at),
                    ),
                    new.last_done_at,
                ),
                else_=t.last_done_at,
            ),
        ),
        ("last_enqueued_at", case((moves, new.last_enqueued_at), else_=t.last_enqueued_at)),
        ("last_message_id", case((moves, new.last_message_id), else_=t.last_message_id)),
        ("last_error", case((decides_error, new.last_error), else_=t.last_error)),
    ]
    set_ += [(col, t[col] + new[col]) for col in COUNT_COLUMNS.values()]
    set_.append(("runs_count", t.runs_count + new.runs_count))
    set_.append(("last_slot_at", case((moves, new.last_slot_at), else_=t.last_slot_at)))
    return set_


# The heartbeat, one builder for every database: the manager's row updated and, with a
# ``reap_before``, the managers whose heartbeat is older counted (never this one): they are
# removed apart (:meth:`DatabaseRuntimeStore.reap`), never inside a heartbeat, which a lease round
# may carry under its own short bound (a dead manager's entries cascading in the round's
# statement made every round of the survivors time out: they lost their partitions). The
# parameters are named (BEAT_PARAMS, in the order of :func:`beat_params`): SQLite and
# MariaDB/MySQL run the two statements in one transaction; PostgreSQL runs them as one statement
# (BEAT_PG, or inside a lease round: :func:`beat_ctes`), in which both parts see the same
# snapshot, where this manager's own row may still be old. A ``reap_before`` of None counts none.
BEAT_PARAMS = (
    "b_at",
    "b_leader",
    "b_sync_at",
    "b_sync_error",
    "b_entries",
    "b_offset",
    "b_manager",
    "b_reap",
    "b_target_down",
)
# On the database's clock (PostgreSQL): no instant of the manager's; ``b_silence`` is how long a
# manager's heartbeat may be silent (on the server's clock) before it is counted dead.
BEAT_PARAMS_SERVER = (
    "b_leader",
    "b_sync_at",
    "b_sync_error",
    "b_entries",
    "b_offset",
    "b_manager",
    "b_silence",
    "b_target_down",
)


def beat_params(
    manager_id: str,
    status: ManagerStatus,
    reap_before: datetime | None,
    *,
    server_clock: bool = False,
) -> dict[str, Any]:
    """The parameters of :func:`beat_statements`, by name, in the order of BEAT_PARAMS (with
    ``server_clock``: of BEAT_PARAMS_SERVER, the silence being ``reap_before``'s distance from
    the status's heartbeat)."""
    if server_clock:
        silence = None if reap_before is None else status.heartbeat_at - reap_before
        values: tuple[Any, ...] = (
            status.is_leader,
            status.last_sync_at,
            status.last_sync_error,
            status.entry_count,
            status.clock_offset_s,
            manager_id,
            silence,
            status.target_down,
        )
        return dict(zip(BEAT_PARAMS_SERVER, values, strict=True))
    values = (
        status.heartbeat_at,
        status.is_leader,
        status.last_sync_at,
        status.last_sync_error,
        status.entry_count,
        status.clock_offset_s,
        manager_id,
        reap_before,
        status.target_down,
    )
    return dict(zip(BEAT_PARAMS, values, strict=True))


def beat_statements(*, server_clock: bool = False) -> tuple[Any, Any]:
    """The heartbeat's UPDATE of the manager's row (RETURNING 1 where it is folded) and the
    count of the managers due for reaping (SELECT), with the named parameters BEAT_PARAMS (with
    ``server_clock``, BEAT_PARAMS_SERVER: the beat is the database's now(), and a manager is due
    when silent for ``b_silence`` on that clock)."""
    if server_clock:
        at: Any = func.now()
        before: Any = func.now() - cast(bindparam("b_silence", type_=Interval), Interval)
    else:
        at, before = bindparam("b_at"), bindparam("b_reap")
    beat = (
        update(managers_table)
        .where(managers_table.c.manager_id == bindparam("b_manager"))
        .values(
            heartbeat_at=at,
            is_leader=bindparam("b_leader"),
            last_sync_at=bindparam("b_sync_at"),
            last_sync_error=bindparam("b_sync_error"),
            entry_count=bindparam("b_entries"),
            clock_offset_s=bindparam("b_offset"),
            target_down=bindparam("b_target_down"),
        )
    )
    due = (
        select(func.count())
        .select_from(managers_table)
        .where(
            managers_table.c.heartbeat_at < before,
            managers_table.c.manager_id != bindparam("b_manager"),
        )
    )
    return beat, due


def beat_ctes(first: int, *, server_clock: bool = True) -> str:
    """The heartbeat on PostgreSQL as two CTEs of a statement: ``beat`` (one row per row
    beaten: none when this manager's row is gone) and ``due`` (one row: the number of managers
    due for reaping), on the database's clock, with the parameters BEAT_PARAMS_SERVER as
    ``$first`` onwards (asyncpg's numbered parameters)."""
    beat, due = beat_statements(server_clock=server_clock)
    dialect = postgresql.dialect()
    sql = (
        f"beat AS ({beat.returning(literal_column('1')).compile(dialect=dialect)}),"
        f" due AS ({due.compile(dialect=dialect)})"
    )
    for n, name in enumerate(BEAT_PARAMS_SERVER if server_clock else BEAT_PARAMS, start=first):
        sql = sql.replace(f"%({name})s", f"${n}")
    assert "%(" not in sql, sql
    return sql


# The heartbeat on PostgreSQL in one statement: the number of rows beaten (0: the row is gone) and
# of the managers due for reaping.
_BEAT_COUNTS = "SELECT (SELECT count(*) FROM beat), (SELECT * FROM due)"
BEAT_PG = f"WITH {beat_ctes(1)} {_BEAT_COUNTS}"
BEAT_PG_LOCAL = f"WITH {beat_ctes(1, server_clock=False)} {_BEAT_COUNTS}"  # the instants given
REAP_MANAGERS = 100  # managers removed by one reap at most (the next heartbeat finds the rest)
REAP_CHUNK = 5_000  # entries of a dead manager removed per transaction
