"""``pm_managers``: a manager's row, its heartbeat, and the removal of dead managers with their
entries. The SQL of :class:`~periodic_manager.db.store.DatabaseRuntimeStore`'s manager side: the
store decides when (and on which clock), this module says how."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Interval, bindparam, cast, delete, func, literal_column, select, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.contracts import ManagerInfo, ManagerStatus
from periodic_manager.db.engine import chunks
from periodic_manager.db.models import entries_table, managers_table
from periodic_manager.db.upsert import upsert

# The columns of a manager's row that its status gives, each the status's field of that name.
_STATUS_COLUMNS = (
    "heartbeat_at",
    "is_leader",
    "last_sync_at",
    "last_sync_error",
    "entry_count",
    "target_down",
    "clock_offset_s",
)


def _status_values(status: ManagerStatus) -> dict[str, Any]:
    """The columns of a manager's row that ``status`` sets."""
    return {name: getattr(status, name) for name in _STATUS_COLUMNS}


async def register(
    engine: AsyncEngine, info: ManagerInfo, status: ManagerStatus, *, server_clock: bool
) -> None:
    """Create or replace the manager's row (with ``server_clock``, its heartbeat the database's
    now()) and drop any entries it had published before."""
    values = {
        "manager_id": info.manager_id,
        "hostname": info.hostname,
        "pid": info.pid,
        "version": info.version,
        "started_at": info.started_at,
        **_status_values(status),
    }
    if server_clock:  # liveness on the database's clock (started_at stays this one's)
        values["heartbeat_at"] = func.now()
    stmt = upsert(
        engine,
        managers_table,
        ["manager_id"],
        lambda new: [(k, new[k]) for k in values if k != "manager_id"],
    ).values(values)
    async with engine.begin() as conn:
        await conn.execute(stmt)
        await conn.execute(
            delete(entries_table).where(entries_table.c.manager_id == info.manager_id)
        )


async def reap(engine: AsyncEngine, cutoff: Any) -> int:
    """Remove the managers whose heartbeat is older than ``cutoff`` and their entries (see
    :meth:`~periodic_manager.db.store.DatabaseRuntimeStore.reap`); how many managers."""
    m, e = managers_table.c, entries_table.c
    async with engine.connect() as conn:
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
            async with engine.begin() as conn:
                ids = list(
                    (
                        await conn.execute(
                            select(e.entry_id).where(e.manager_id == manager_id).limit(REAP_CHUNK)
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
        async with engine.begin() as conn:
            result = await conn.execute(delete(managers_table).where(m.manager_id == manager_id))
        removed += int(result.rowcount)
    return removed


# The heartbeat, one builder for every database: the manager's row updated and, with a
# ``reap_before``, the managers whose heartbeat is older counted (never this one): they are
# removed apart (:func:`reap`), never inside a heartbeat, which a lease round
# may carry under its own short bound (a dead manager's entries cascading in the round's
# statement made every round of the survivors time out: they lost their partitions). The
# parameters are named (BEAT_PARAMS, in the order of :func:`beat_params`): SQLite and
# MariaDB/MySQL run the two statements in one transaction; PostgreSQL runs them as one statement
# (BEAT_PG, or inside a lease round: :func:`beat_ctes`), in which both parts see the same
# snapshot, where this manager's own row may still be old. A ``reap_before`` of None counts none.
# The parameters both heartbeats name alike come in the middle, in order.
_BEAT_SHARED = ("b_leader", "b_sync_at", "b_sync_error", "b_entries", "b_offset", "b_manager")
BEAT_PARAMS = ("b_at", *_BEAT_SHARED, "b_reap", "b_target_down")
# On the database's clock (PostgreSQL): no instant of the manager's; ``b_silence`` is how long a
# manager's heartbeat may be silent (on the server's clock) before it is counted dead.
BEAT_PARAMS_SERVER = (*_BEAT_SHARED, "b_silence", "b_target_down")


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
    shared = (
        status.is_leader,
        status.last_sync_at,
        status.last_sync_error,
        status.entry_count,
        status.clock_offset_s,
        manager_id,
    )
    if server_clock:
        silence = None if reap_before is None else status.heartbeat_at - reap_before
        values: tuple[Any, ...] = (*shared, silence, status.target_down)
        return dict(zip(BEAT_PARAMS_SERVER, values, strict=True))
    values = (status.heartbeat_at, *shared, reap_before, status.target_down)
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
