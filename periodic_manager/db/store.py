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

History (``pm_runs``): every batch of runs is also inserted there, in the same transaction as the
state upsert (one executemany per chunk of rows). It is bounded two ways by :meth:`prune_runs`:
rows older than ``runs_retention`` go, and each schedule written since the last prune keeps only
its newest ``runs_per_schedule`` rows. Every DELETE is bounded (by rows or by schedule keys). The
manager's heartbeat runs the prune, at most once per ``prune_interval`` and off the enqueue path;
a failing prune is logged and never fails the heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import RowMapping, and_, case, delete, func, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.contracts import (
    EntryRecord,
    LastGoodVersion,
    ManagerInfo,
    ManagerStatus,
    RunRecord,
    StateRecord,
    StoredVersion,
)
from periodic_manager.db import last_good
from periodic_manager.db.models import Entry, Manager, Run, ScheduleState
from periodic_manager.errors import NotFoundError

# Stored counters, one column per run status.
COUNT_COLUMNS = {
    "enqueued": "enqueued_count",
    "duplicate": "duplicate_count",
    "skipped": "skipped_count",
    "failed": "failed_count",
    "held": "held_count",
    "resent": "resent_count",
}
# Labelled columns, so one joined row names both tables' columns without clashes.
_MANAGER_COLS = [c.label(f"m_{c.name}") for c in Manager.__table__.c]
_ENTRY_COLS = [c.label(f"e_{c.name}") for c in Entry.__table__.c]
# Keeps IN (...) lists well under every driver's bind-parameter limit.
_CHUNK = 500
# pm_runs: rows per executemany, rows per age-based DELETE, DELETE rounds per prune.
_RUNS_INSERT_CHUNK = 5000
_STATE_UPSERT_CHUNK = 1000  # state rows per statement (each is built and bound in one go)
_BUILD_SLICE = 5000  # runs handled between yields while a batch is prepared
_PRUNE_BATCH = 5000
_PRUNE_ROUNDS = 20
_ERROR_MAX = 2000  # characters of an error kept in history
_MS = timedelta(milliseconds=1)
_RUN_COLUMNS = ("schedule_key", "name", "slot_at", "status", "at", "lateness_ms", "message_id", "error")

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ManagerRecord:
    """A manager as stored: who it is and its last heartbeat."""

    info: ManagerInfo
    status: ManagerStatus


@dataclass(frozen=True, slots=True)
class LiveEntry:
    """An entry together with the manager that holds it (for ``GET /entries``)."""

    manager: ManagerRecord
    entry: EntryRecord


class DatabaseRuntimeStore:
    """:class:`~periodic_manager.runtime.memory_store.RuntimeStore` backed by the schedule database."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        runs_retention: timedelta | None = timedelta(days=7),
        runs_per_schedule: int = 100,
        prune_interval: timedelta = timedelta(minutes=1),
    ) -> None:
        """``runs_retention``: history rows older than this are pruned (None: no age limit);
        ``runs_per_schedule``: newest rows kept per schedule (0: no history is written)."""
        if runs_per_schedule < 0:
            raise ValueError("runs_per_schedule must be >= 0")
        self.engine = engine
        self.runs_retention = runs_retention
        self.runs_per_schedule = runs_per_schedule
        self.prune_interval = prune_interval
        self._touched: set[str] = set()  # schedule keys with history written since the last prune
        self._next_prune_at: datetime | None = None
        dialect = engine.dialect.name
        # The two dialects' Insert share the on_conflict_do_update API but no base class.
        self._insert: Callable[[Any], Any]
        self._copy = dialect == "postgresql" and engine.dialect.driver == "asyncpg"
        if dialect == "postgresql":
            self._insert = postgresql.insert
        elif dialect == "sqlite":
            self._insert = sqlite.insert
        else:
            raise ValueError(f"unsupported database {dialect!r}: use postgresql or sqlite")

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
        stmt = self._insert(Manager).values(values)
        stmt = stmt.on_conflict_do_update(
            index_elements=[Manager.manager_id],
            set_={k: stmt.excluded[k] for k in values if k != "manager_id"},
        )
        async with self.engine.begin() as conn:
            await conn.execute(stmt)
            await conn.execute(delete(Entry).where(Entry.manager_id == info.manager_id))

    async def heartbeat(self, manager_id: str, status: ManagerStatus) -> None:
        """Update the manager's row (one UPDATE). NotFoundError if the row is gone (reaped)."""
        stmt = (
            update(Manager).where(Manager.manager_id == manager_id).values(_status_values(status))
        )
        async with self.engine.begin() as conn:
            result = await conn.execute(stmt)
        if result.rowcount == 0:
            raise NotFoundError(manager_id)
        await self._maybe_prune(status.heartbeat_at)

    async def _maybe_prune(self, now: datetime) -> None:
        # The first heartbeat only sets the timer: a prune never delays a manager's start.
        if self._next_prune_at is None:
            self._next_prune_at = now + self.prune_interval
            return
        if now < self._next_prune_at:
            return
        self._next_prune_at = now + self.prune_interval
        try:
            removed = await self.prune_runs(now)
        except Exception as exc:  # history is housekeeping: never fail the heartbeat for it
            log.warning("pruning run history failed (retried later): %s", exc)
            return
        if removed:
            log.debug("pruned %d history row(s)", removed)

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
            for chunk in _chunks(removed):
                await conn.execute(
                    delete(Entry).where(Entry.manager_id == manager_id, Entry.entry_id.in_(chunk))
                )
            if upserts:
                stmt = self._insert(Entry)
                stmt = stmt.on_conflict_do_update(
                    index_elements=[Entry.manager_id, Entry.entry_id],
                    set_={
                        c.name: stmt.excluded[c.name]
                        for c in Entry.__table__.c
                        if c.name not in ("manager_id", "entry_id")
                    },
                )
                # In slices, each built just before it is sent: every statement stays well inside
                # the driver's command timeout, and the event loop is never held for long, even
                # when a cold start publishes 100,000 entries.
                for i in range(0, len(upserts), _RUNS_INSERT_CHUNK):
                    rows = [_entry_values(manager_id, r) for r in upserts[i : i + _RUNS_INSERT_CHUNK]]
                    await conn.execute(stmt, rows)

    async def record_runs(self, runs: Sequence[RunRecord]) -> None:
        """Fold a batch of runs into ``pm_schedule_state``: one statement per batch.

        Each schedule's runs are first folded in Python with :meth:`StateRecord.fold` into a
        fresh record (the batch's delta); the upsert then merges that delta into the stored row
        with the same rules, so the result equals folding every run one by one.
        """
        if not runs:
            return
        # The Python side of a burst's history (folding, building rows) goes in slices with a
        # yield between them: 100,000 runs in one go held the event loop for ~0.3 s, and the
        # next instant's dispatch would have waited on it.
        deltas: dict[str, StateRecord] = {}
        updated_at: dict[str, datetime] = {}
        for i, run in enumerate(runs):
            delta = deltas.setdefault(run.schedule_key, StateRecord(run.schedule_key, run.name))
            delta.fold(run)
            updated_at[run.schedule_key] = max(run.at, updated_at.get(run.schedule_key, run.at))
            if i % _BUILD_SLICE == _BUILD_SLICE - 1:
                await asyncio.sleep(0)
        # Sorted so that concurrent writers lock rows in the same order (no deadlock).
        keys = sorted(deltas)
        async with self.engine.begin() as conn:
            upsert = self._state_upsert()
            for i in range(0, len(keys), _STATE_UPSERT_CHUNK):  # slices: within the command timeout
                part = keys[i : i + _STATE_UPSERT_CHUNK]
                await conn.execute(upsert, [_state_values(deltas[k], updated_at[k]) for k in part])
            if self.runs_per_schedule and self._copy:
                # COPY: a burst's 100,000 history rows in one stream, not 20 executemany rounds.
                records: list[tuple[Any, ...]] = []
                for i, run in enumerate(runs):
                    h = _run_values(run)
                    records.append(tuple(h[c] for c in _RUN_COLUMNS))
                    if i % _BUILD_SLICE == _BUILD_SLICE - 1:
                        await asyncio.sleep(0)
                raw = await conn.get_raw_connection()
                await raw.driver_connection.copy_records_to_table(  # type: ignore[union-attr]
                    Run.__tablename__, records=records, columns=_RUN_COLUMNS
                )
            elif self.runs_per_schedule:
                for i in range(0, len(runs), _RUNS_INSERT_CHUNK):
                    part = runs[i : i + _RUNS_INSERT_CHUNK]
                    await conn.execute(insert(Run), [_run_values(run) for run in part])
        if self.runs_per_schedule:
            self._touched.update(deltas)

    async def prune_runs(self, now: datetime, keys: Iterable[str] | None = None) -> int:
        """Apply the history bounds; returns the number of rows deleted.

        Rows with ``at`` older than ``now - runs_retention`` are deleted in bounded batches (at
        most ``_PRUNE_ROUNDS`` per call; the rest goes at the next call). Then every schedule in
        ``keys`` (default: those written since the last prune) keeps its newest
        ``runs_per_schedule`` rows, ``_CHUNK`` schedules per statement.
        """
        removed = 0
        if self.runs_retention is not None:
            cutoff = now - self.runs_retention
            for _ in range(_PRUNE_ROUNDS):
                old = select(Run.id).where(Run.at < cutoff).order_by(Run.at).limit(_PRUNE_BATCH)
                async with self.engine.begin() as conn:
                    result = await conn.execute(
                        delete(Run).where(Run.id.in_(old.scalar_subquery()))
                    )
                removed += int(result.rowcount)
                if result.rowcount < _PRUNE_BATCH:
                    break
        if keys is None:
            keys, self._touched = self._touched, set()
        for chunk in _chunks(sorted(set(keys))):
            removed += await self._cap_runs(chunk)
        return removed

    async def _cap_runs(self, keys: Sequence[str]) -> int:
        rank = (
            func.row_number()
            .over(partition_by=Run.schedule_key, order_by=(Run.slot_at.desc(), Run.id.desc()))
            .label("rn")
        )
        ranked = select(Run.id, rank).where(Run.schedule_key.in_(keys)).subquery()
        excess = select(ranked.c.id).where(ranked.c.rn > self.runs_per_schedule)
        async with self.engine.begin() as conn:
            result = await conn.execute(delete(Run).where(Run.id.in_(excess.scalar_subquery())))
        return int(result.rowcount)

    async def delete_runs(self, schedule_key: str) -> int:
        """Forget a schedule's history (its row was deleted); returns the rows deleted."""
        async with self.engine.begin() as conn:
            result = await conn.execute(delete(Run).where(Run.schedule_key == schedule_key))
        return int(result.rowcount)

    def _state_upsert(self) -> Any:
        t = ScheduleState.__table__.c
        stmt = self._insert(ScheduleState)
        new = stmt.excluded
        # The batch moved the last slot iff it had an enqueued/duplicate run (then the delta's
        # last_slot_at is set); like StateRecord.fold, an equal slot replaces (the later run wins).
        moves = and_(
            new.last_slot_at.is_not(None),
            or_(t.last_slot_at.is_(None), new.last_slot_at >= t.last_slot_at),
        )
        # The batch decided last_error iff it had an enqueued, duplicate or failed run: the
        # delta then holds the outcome of the last one (None clears); skipped runs leave it.
        decides_error = (
            new.enqueued_count + new.duplicate_count + new.resent_count + new.failed_count
        ) > 0
        set_: dict[str, Any] = {
            "name": new.name,
            "last_status": new.last_status,
            "updated_at": new.updated_at,
            "last_slot_at": case((moves, new.last_slot_at), else_=t.last_slot_at),
            # The latest settled slot only ever moves forward.
            "last_done_at": case(
                (
                    and_(
                        new.last_done_at.is_not(None),
                        or_(t.last_done_at.is_(None), new.last_done_at > t.last_done_at),
                    ),
                    new.last_done_at,
                ),
                else_=t.last_done_at,
            ),
            "last_enqueued_at": case((moves, new.last_enqueued_at), else_=t.last_enqueued_at),
            "last_message_id": case((moves, new.last_message_id), else_=t.last_message_id),
            "last_error": case((decides_error, new.last_error), else_=t.last_error),
        }
        for col in COUNT_COLUMNS.values():
            set_[col] = t[col] + new[col]
        return stmt.on_conflict_do_update(index_elements=[t.schedule_key], set_=set_)

    async def unregister_manager(self, manager_id: str) -> None:
        """Remove the manager; its entries go with it (ON DELETE CASCADE)."""
        async with self.engine.begin() as conn:
            await conn.execute(delete(Manager).where(Manager.manager_id == manager_id))

    async def reap(self, older_than: datetime) -> int:
        """Remove managers whose heartbeat is older than ``older_than`` (entries cascade)."""
        async with self.engine.begin() as conn:
            result = await conn.execute(delete(Manager).where(Manager.heartbeat_at < older_than))
        return int(result.rowcount)

    # -- reads (the API) -----------------------------------------------------------------------

    async def list_managers(self, alive_after: datetime | None = None) -> list[ManagerRecord]:
        """Managers ordered by id; only those with ``heartbeat_at >= alive_after`` if given."""
        stmt = select(*_MANAGER_COLS).order_by(Manager.manager_id)
        if alive_after is not None:
            stmt = stmt.where(Manager.heartbeat_at >= alive_after)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        return [_manager_record(r._mapping) for r in rows]

    async def list_entries(self, alive_after: datetime) -> list[LiveEntry]:
        """Entries of managers whose ``heartbeat_at >= alive_after``, each with its manager.

        One query; ordered by manager, schedule key and entry id, so listings are stable.
        """
        stmt = (
            select(*_MANAGER_COLS, *_ENTRY_COLS)
            .join_from(Manager, Entry, Entry.manager_id == Manager.manager_id)
            .where(Manager.heartbeat_at >= alive_after)
            .order_by(Manager.manager_id, Entry.schedule_key, Entry.entry_id)
        )
        async with self.engine.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        managers: dict[str, ManagerRecord] = {}
        out: list[LiveEntry] = []
        for row in rows:
            m = row._mapping
            manager = managers.get(m["m_manager_id"])
            if manager is None:
                manager = managers[m["m_manager_id"]] = _manager_record(m)
            out.append(LiveEntry(manager=manager, entry=_entry_record(m)))
        return out

    async def get_state(self, schedule_keys: Iterable[str]) -> dict[str, StateRecord]:
        """Stored state of the given schedules (absent keys are simply missing).

        ``counts`` holds only the statuses seen, as the memory store's does.
        """
        keys = list(dict.fromkeys(schedule_keys))
        out: dict[str, StateRecord] = {}
        async with self.engine.connect() as conn:
            for chunk in _chunks(keys):
                stmt = select(ScheduleState.__table__).where(ScheduleState.schedule_key.in_(chunk))
                for row in (await conn.execute(stmt)).all():
                    out[row.schedule_key] = _state_record(row._mapping)
        return out

    async def settled_after(self, since: datetime) -> dict[str, datetime]:
        """The latest settled slot of each schedule settled after ``since`` (read once per
        takeover, in slices)."""
        t = ScheduleState.__table__.c
        stmt = select(t.schedule_key, t.last_done_at).where(t.last_done_at > since)
        async with self.engine.connect() as conn:
            result = await conn.stream(stmt.execution_options(yield_per=_BUILD_SLICE))
            out: dict[str, datetime] = {}
            async for part in result.partitions():
                out.update((key, at) for key, at in part)
                await asyncio.sleep(0)
        return out

    async def delete_state(self, schedule_key: str) -> bool:
        """Forget a schedule's runtime state (its row was deleted); True if there was any."""
        async with self.engine.begin() as conn:
            result = await conn.execute(
                delete(ScheduleState).where(ScheduleState.schedule_key == schedule_key)
            )
        return bool(result.rowcount)

    # -- last good versions (periodic_manager.runtime.last_good; SQL in db/last_good.py) ----------------

    async def save_last_good(self, versions: Sequence[LastGoodVersion]) -> None:
        """Store the last good version of rows that turned bad (see ``db.last_good.save``)."""
        await last_good.save(self.engine, self._insert, versions)

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


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def _manager_record(m: RowMapping) -> ManagerRecord:
    info = ManagerInfo(
        manager_id=m["m_manager_id"],
        hostname=m["m_hostname"],
        pid=m["m_pid"],
        version=m["m_version"],
        started_at=m["m_started_at"],
    )
    status = ManagerStatus(
        heartbeat_at=m["m_heartbeat_at"],
        is_leader=bool(m["m_is_leader"]),
        last_sync_at=m["m_last_sync_at"],
        last_sync_error=m["m_last_sync_error"],
        entry_count=m["m_entry_count"],
    )
    return ManagerRecord(info=info, status=status)


def _entry_record(m: RowMapping) -> EntryRecord:
    return EntryRecord(
        entry_id=m["e_entry_id"],
        schedule_key=m["e_schedule_key"],
        name=m["e_name"],
        content_hash=m["e_content_hash"],
        status=m["e_status"],
        registered_at=m["e_registered_at"],
        spec=m["e_spec"],
        timezone=m["e_timezone"],
        anchor=m["e_anchor"],
        task_type=m["e_task_type"],
        queue=m["e_queue"],
        last_error=m["e_last_error"],
        held_slot=m["e_held_slot_at"],
        previous_task_id=m["e_previous_task_id"],
        previous_task_state=m["e_previous_task_state"],
        last_good_since=m["e_last_good_since"],
    )


def _state_record(m: RowMapping) -> StateRecord:
    return StateRecord(
        schedule_key=m["schedule_key"],
        name=m["name"],
        last_slot_at=m["last_slot_at"],
        last_done_at=m["last_done_at"],
        last_enqueued_at=m["last_enqueued_at"],
        last_message_id=m["last_message_id"],
        last_status=m["last_status"],
        last_error=m["last_error"],
        counts={s: int(m[col]) for s, col in COUNT_COLUMNS.items() if m[col]},
    )


def _status_values(status: ManagerStatus) -> dict[str, Any]:
    return {
        "heartbeat_at": status.heartbeat_at,
        "is_leader": status.is_leader,
        "last_sync_at": status.last_sync_at,
        "last_sync_error": status.last_sync_error,
        "entry_count": status.entry_count,
    }


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
        "previous_task_id": rec.previous_task_id[:128] if rec.previous_task_id else None,
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
    return values


def _run_values(run: RunRecord) -> dict[str, Any]:
    slot, at = run.slot, run.at
    # Elapsed time in UTC: aware datetimes sharing one non-UTC zone subtract as wall-clock times.
    if slot.tzinfo is not UTC:
        slot = slot.astimezone(UTC)
    if at.tzinfo is not UTC:
        at = at.astimezone(UTC)
    error = run.error[:_ERROR_MAX] if run.error is not None else None
    return {
        "schedule_key": run.schedule_key,
        "name": run.name,
        "slot_at": slot,
        "status": run.status,
        "at": at,
        "lateness_ms": round((at - slot) / _MS),
        "message_id": run.message_id[:128] if run.message_id is not None else None,
        "error": error,
    }
