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

from sqlalchemy import Interval, bindparam, cast, delete, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager import gcpolicy
from periodic_manager.contracts import (
    EntryRecord,
    FailureCount,
    LastGoodVersion,
    ManagerInfo,
    ManagerStatus,
    RunRecord,
    StateRecord,
    StoredVersion,
)
from periodic_manager.db import (
    backfill_slots,
    change_history,
    entry_writes,
    history,
    last_good,
    managers,
    schedule_state,
    store_reads,
)
from periodic_manager.db.engine import backend
from periodic_manager.db.models import managers_table, schedule_state_table
from periodic_manager.errors import NotFoundError, cause
from periodic_manager.pacing import in_turns

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
        await managers.register(self.engine, info, status, server_clock=self._server_clock)

    async def heartbeat(
        self, manager_id: str, status: ManagerStatus, *, reap_before: datetime | None = None
    ) -> int:
        """Update the manager's row (one UPDATE) and, with ``reap_before``, count the other
        managers whose heartbeat is older: one checkout and one commit per beat (on PostgreSQL
        one statement in autocommit: a single round trip, the cost of a manager at rest). The
        count is returned: the caller removes them apart (:meth:`reap`), so that a dead
        manager's entries, however many, never weigh on a heartbeat. NotFoundError if the row
        is gone (reaped). The statements are :func:`.managers.beat_statements` (on PostgreSQL
        folded into one, :data:`.managers.BEAT_PG`). The history prune is not run here: the caller runs :meth:`beaten`
        after it, apart (a long prune must not delay the next beat)."""
        params = managers.beat_params(
            manager_id, status, reap_before, server_clock=self._server_clock
        )
        if self._beat_pg:
            async with self.engine.connect() as conn:
                driver = (await conn.get_raw_connection()).driver_connection
                assert driver is not None
                sql = managers.BEAT_PG if self._server_clock else managers.BEAT_PG_LOCAL
                beaten, dead = await driver.fetchrow(sql, *params.values())
        else:
            beat, due = managers.beat_statements(server_clock=self._server_clock)
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
        :func:`.managers.beat_ctes`, with :func:`.managers.beat_params`, then :meth:`beaten` (on the database's
        clock)."""
        return self._beat_pg and self._server_clock

    def beat_values(
        self, manager_id: str, status: ManagerStatus, reap_before: datetime | None
    ) -> tuple[Any, ...]:
        """The parameters of :func:`.managers.beat_ctes` (a heartbeat carried by another statement)."""
        values = managers.beat_params(manager_id, status, reap_before, server_clock=True)
        return tuple(values.values())

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
            log.warning("pruning run history failed (retried later): %s", cause(exc))
        else:
            if removed:
                log.debug("pruned %d history row(s)", removed)
        if not shared:
            return  # another manager prunes the change history
        try:
            removed = await self.prune_changes(now)
        except Exception as exc:
            log.warning("pruning change history failed (retried later): %s", cause(exc))
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
            await entry_writes.apply(conn, manager_id, upserts, removed, copy=self._copy)

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
                await schedule_state.count_runs(conn, limited, runs, deltas)
            upsert = schedule_state.upsert_statement(conn)
            for i in range(0, len(keys), _STATE_UPSERT_CHUNK):  # slices: within the command timeout
                part = keys[i : i + _STATE_UPSERT_CHUNK]
                rows = [schedule_state.values(deltas[k], updated_at[k]) for k in part]
                await conn.execute(upsert, rows)
            if self.runs_per_schedule:
                await history.write(conn, runs, copy=self._copy)
        if self.runs_per_schedule:
            self._touched.update(deltas)

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
        of ``managers.REAP_CHUNK`` (each a moment's lock), then its row (whatever entries are
        left go with it, ON DELETE CASCADE). A manager that comes back meanwhile loses its row too: it
        finds it gone at its next heartbeat and publishes itself and its entries again."""
        cutoff: Any = older_than
        if self._server_clock and silence is not None:
            cutoff = func.now() - cast(bindparam("silence", silence, type_=Interval), Interval)
        return await managers.reap(self.engine, cutoff)

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
