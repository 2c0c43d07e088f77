"""The http target's deliveries, ``pm_http_deliveries``: the one reader and writer of the table.

A slot becomes one row, unique on its idempotency key (:meth:`DeliveryStore.insert`: a key that
is there already is a duplicate, whoever sent it first). Any manager's deliverer claims due
pending rows with a lease (:meth:`DeliveryStore.claim`: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL
and MariaDB/MySQL, SQLite has one writer) and records what each attempt came to
(:meth:`DeliveryStore.record`), fenced by its lease: an outcome of a manager whose lease another
took over is dropped, the row is that manager's now. Rows in state ``dead`` are the dead letters:
listed, replayed (pending again, attempts from zero, the same key) and purged here too.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, delete, func, or_, select, text, update
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.db.engine import backend
from periodic_manager.db.models import http_deliveries_table as table

PENDING = "pending"
DONE = "done"
DEAD = "dead"
STATES = (PENDING, DONE, DEAD)
CHUNK = 500  # rows per INSERT and per IN list

_CLAIMED = (
    table.c.id,
    table.c.idempotency_key,
    table.c.name,
    table.c.slot_at,
    table.c.host,
    table.c.request,
    table.c.body,
    table.c.attempts,
    table.c.created_at,
)


@dataclass(frozen=True, slots=True)
class Claimed:
    """A pending delivery leased to this deliverer until ``locked_until``."""

    id: int
    idempotency_key: str
    name: str
    slot_at: datetime
    host: str
    request: str  # JSON text (targets/http/request.py reads it)
    body: str
    attempts: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an attempt came to: ``state`` done, pending (retry at ``next_attempt_at``) or dead."""

    id: int
    state: str
    attempts: int
    at: datetime
    next_attempt_at: datetime | None = None
    status: int | None = None
    error: str | None = None
    body: str | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A delivery that ended dead, as the API and the CLI show it."""

    id: int
    schedule: str
    slot: datetime
    idempotency_key: str
    url: str
    attempts: int
    last_status: int | None
    last_error: str | None
    body_excerpt: str | None
    created_at: datetime
    dead_at: datetime | None


class DeliveryStore:
    """Reads and writes ``pm_http_deliveries`` through ``engine`` (see the module doc)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._dialect = backend(engine)
        if self._dialect == "mysql":  # the reads around the insert need one snapshot
            engine = engine.execution_options(isolation_level="REPEATABLE READ")
        self._engine = engine

    # -- the target's side ----------------------------------------------------------------------

    async def insert(self, rows: Sequence[dict[str, Any]]) -> dict[str, tuple[int, bool]]:
        """Insert ``rows`` (every column but id and the outcome's) in one transaction; for each
        key, its row id and whether it was inserted now (False: it was there already)."""
        keys = sorted({r["idempotency_key"] for r in rows})
        async with self._engine.begin() as conn:
            if self._dialect == "mysql":
                there = await _ids(conn, keys)
                fresh = [r for r in rows if r["idempotency_key"] not in there]
                for start in range(0, len(fresh), CHUNK):
                    stmt = mysql.insert(table).values(fresh[start : start + CHUNK])
                    await conn.execute(stmt.on_duplicate_key_update(id=table.c.id))
                now = await _ids(conn, [r["idempotency_key"] for r in fresh])
                return {**{k: (i, False) for k, i in there.items()}, **_new(now)}
            inserted: dict[str, int] = {}
            ordered = sorted(rows, key=lambda r: r["idempotency_key"])  # one lock order
            for start in range(0, len(ordered), CHUNK):
                insert = (postgresql if self._dialect == "postgresql" else sqlite).insert
                stmt = (
                    insert(table)
                    .values(ordered[start : start + CHUNK])
                    .on_conflict_do_nothing(index_elements=["idempotency_key"])
                    .returning(table.c.id, table.c.idempotency_key)
                )
                inserted.update({key: id_ for id_, key in (await conn.execute(stmt)).all()})
            there = await _ids(conn, [k for k in keys if k not in inserted])
        return {**{k: (i, False) for k, i in there.items()}, **_new(inserted)}

    async def insert_after(
        self, row: dict[str, Any], overlap_timeout: timedelta | None
    ) -> tuple[int | None, bool, tuple[int, str, bool] | None]:
        """Insert ``row`` unless its schedule's newest delivery is still pending (younger than
        ``overlap_timeout``, when given): ``options.overlap`` skip and hold. Decided behind a lock on the
        schedule's name (PostgreSQL: a transaction-level advisory lock; MariaDB/MySQL: a named
        lock and locking reads; SQLite: one writer), so two managers never both find it free.
        Returns the row's id (None: not inserted), whether it was inserted now, and the newest
        delivery seen before: id, state, and whether it counted as finished for its age."""
        name, key = row["name"], row["idempotency_key"]
        async with self._engine.connect() as conn:
            try:
                async with conn.begin():
                    if self._dialect == "postgresql":
                        await conn.execute(_PG_LOCK, {"key": _lock_key(name)})
                    elif self._dialect == "mysql":
                        got = (await conn.execute(_MY_LOCK, {"key": name})).scalar()
                        if got != 1:
                            raise TimeoutError(f"schedule {name!r} stayed locked 10 s")
                    locking = self._dialect == "mysql"
                    there = await _ids(conn, [key], locking=locking)
                    if key in there:
                        return there[key], False, None
                    newest = select(table.c.id, table.c.state, table.c.created_at).where(
                        table.c.name == name
                    )
                    newest = newest.order_by(table.c.id.desc()).limit(1)
                    if locking:
                        newest = newest.with_for_update(read=True)
                    prev = (await conn.execute(newest)).first()
                    seen = None if prev is None else (int(prev[0]), str(prev[1]), False)
                    if prev is not None and prev[1] == PENDING:
                        young = row["created_at"] - prev[2] < (overlap_timeout or _FOREVER)
                        if overlap_timeout is None or young:
                            return None, False, seen
                        seen = (int(prev[0]), PENDING, True)  # timed out: counts as finished
                    await conn.execute(table.insert().values(row))
                    found = await _ids(conn, [key], locking=locking)
                    return found[key], True, seen
            finally:
                if self._dialect == "mysql":
                    await conn.execute(_MY_UNLOCK)

    async def states(self, ids: Collection[int]) -> dict[int, str]:
        """The state of each of ``ids`` still stored."""
        found: dict[int, str] = {}
        ordered = sorted(ids)
        async with self._engine.connect() as conn:
            for start in range(0, len(ordered), CHUNK):
                stmt = select(table.c.id, table.c.state).where(
                    table.c.id.in_(ordered[start : start + CHUNK])
                )
                found.update({i: s for i, s in (await conn.execute(stmt)).all()})
        return found

    async def newest(self, name: str) -> tuple[int, str, datetime] | None:
        """The newest delivery of schedule ``name``: id, state and when it was created."""
        stmt = (
            select(table.c.id, table.c.state, table.c.created_at)
            .where(table.c.name == name)
            .order_by(table.c.id.desc())
            .limit(1)
        )
        async with self._engine.connect() as conn:
            row = (await conn.execute(stmt)).first()
        return None if row is None else (row[0], row[1], row[2])

    # -- the deliverer's side -------------------------------------------------------------------

    async def claim(
        self,
        owner: str,
        now: datetime,
        limit: int,
        lease_of: Callable[[str], timedelta],
        busy_hosts: Collection[str] = (),
    ) -> list[Claimed]:
        """Lease up to ``limit`` due pending rows (earliest first, none of ``busy_hosts``, none
        another deliverer holds a lease on) to ``owner``, each until ``now + lease_of(its
        request)`` (a request that may take longer holds its row longer)."""
        due = and_(
            table.c.state == PENDING,
            table.c.next_attempt_at <= now,
            or_(table.c.locked_until.is_(None), table.c.locked_until <= now),
        )
        if busy_hosts:
            due = and_(due, table.c.host.not_in(sorted(busy_hosts)))
        pick = select(*_CLAIMED).where(due).order_by(table.c.next_attempt_at).limit(limit)
        if self._dialect != "sqlite":
            pick = pick.with_for_update(skip_locked=True)
        async with self._engine.begin() as conn:
            rows = (await conn.execute(pick)).all()
            if not rows:
                return []
            by_lease: dict[timedelta, list[int]] = defaultdict(list)
            for row in rows:
                by_lease[lease_of(row.request)].append(row.id)
            for lease, ids in by_lease.items():
                for start in range(0, len(ids), CHUNK):
                    await conn.execute(
                        update(table)
                        .where(table.c.id.in_(ids[start : start + CHUNK]))
                        .values(locked_by=owner, locked_until=now + lease)
                    )
        return [Claimed(*row) for row in rows]

    async def record(self, owner: str, outcomes: Sequence[Outcome]) -> None:
        """Write each outcome onto its row, unless ``owner`` no longer holds the row's lease;
        one statement per kind of outcome (executemany)."""
        by_state: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for o in outcomes:
            by_state[o.state].append(
                {
                    "b_id": o.id,
                    "b_owner": owner,
                    "b_attempts": o.attempts,
                    "b_next": o.next_attempt_at or o.at,
                    "b_status": o.status,
                    "b_error": o.error,
                    "b_body": o.body,
                    "b_finished": None if o.state == PENDING else o.at,
                }
            )
        async with self._engine.begin() as conn:
            for state, params in by_state.items():
                stmt = (
                    update(table)
                    .where(table.c.id == bindparam("b_id"))
                    .where(table.c.locked_by == bindparam("b_owner"))
                    .where(table.c.state == PENDING)
                    .values(
                        state=state,
                        attempts=bindparam("b_attempts"),
                        next_attempt_at=bindparam("b_next"),
                        last_status=bindparam("b_status"),
                        last_error=bindparam("b_error"),
                        last_body=bindparam("b_body"),
                        finished_at=bindparam("b_finished"),
                        locked_by=None,
                        locked_until=None,
                    )
                )
                await conn.execute(stmt.execution_options(synchronize_session=False), params)

    async def release(self, owner: str, ids: Collection[int]) -> None:
        """Give back the leases of rows ``owner`` claimed and did not send (a stop)."""
        if not ids:
            return
        async with self._engine.begin() as conn:
            await conn.execute(
                update(table)
                .where(table.c.id.in_(sorted(ids)), table.c.locked_by == owner)
                .values(locked_by=None, locked_until=None)
            )

    async def prune(self, before: datetime, batch: int = CHUNK, batches: int = 20) -> int:
        """Delete done deliveries finished before ``before`` (dead ones stay: they are the dead
        letters), at most ``batches`` of ``batch`` rows; how many."""
        pick = (
            select(table.c.id)
            .where(table.c.state == DONE, table.c.finished_at < before)
            .order_by(table.c.id)
            .limit(batch)
        )
        deleted = 0
        for _ in range(batches):
            async with self._engine.begin() as conn:
                ids = [i for (i,) in (await conn.execute(pick)).all()]
                if ids:
                    await conn.execute(delete(table).where(table.c.id.in_(ids)))
            deleted += len(ids)
            if len(ids) < batch:
                break
        return deleted

    async def next_due(self) -> datetime | None:
        """When the earliest pending row is due (None: none is pending)."""
        stmt = select(func.min(table.c.next_attempt_at)).where(table.c.state == PENDING)
        async with self._engine.connect() as conn:
            found: datetime | None = (await conn.execute(stmt)).scalar()
        return found


# -- dead letters: the API and the CLI, on a connection of theirs ------------------------------


async def dead_letters(
    conn: AsyncConnection, *, schedule: str | None = None, after_id: int = 0, limit: int = 100
) -> list[DeadLetter]:
    """Dead letters by id (after ``after_id``), of one schedule or all."""
    stmt = (
        select(
            table.c.id,
            table.c.name,
            table.c.slot_at,
            table.c.idempotency_key,
            table.c.request,
            table.c.attempts,
            table.c.last_status,
            table.c.last_error,
            table.c.last_body,
            table.c.created_at,
            table.c.finished_at,
        )
        .where(table.c.state == DEAD, table.c.id > after_id)
        .order_by(table.c.id)
        .limit(limit)
    )
    if schedule is not None:
        stmt = stmt.where(table.c.name == schedule)
    rows = (await conn.execute(stmt)).all()
    return [DeadLetter(r[0], r[1], r[2], r[3], _url(r[4]), *r[5:]) for r in rows]


async def count_dead(conn: AsyncConnection) -> int:
    """How many dead letters there are (a metric)."""
    stmt = select(func.count()).select_from(table).where(table.c.state == DEAD)
    return int((await conn.execute(stmt)).scalar() or 0)


async def replay(
    conn: AsyncConnection,
    now: datetime,
    *,
    ids: Collection[int] | None = None,
    schedule: str | None = None,
) -> int:
    """Make dead letters pending again, due ``now``, attempts from zero, their age from ``now``,
    the same key: those of ``ids`` and of ``schedule`` (neither: all). How many; committed."""
    stmt = (
        update(table)
        .where(*_dead(ids, schedule))
        .values(
            state=PENDING,
            attempts=0,
            created_at=now,
            next_attempt_at=now,
            finished_at=None,
            locked_by=None,
            locked_until=None,
        )
    )
    count = int((await conn.execute(stmt)).rowcount)
    await conn.commit()
    return count


async def purge(
    conn: AsyncConnection, *, ids: Collection[int] | None = None, schedule: str | None = None
) -> int:
    """Delete dead letters (chosen as :func:`replay` chooses them); how many; committed."""
    count = int((await conn.execute(delete(table).where(*_dead(ids, schedule)))).rowcount)
    await conn.commit()
    return count


def _dead(ids: Collection[int] | None, schedule: str | None) -> list[Any]:
    where: list[Any] = [table.c.state == DEAD]
    if ids is not None:
        where.append(table.c.id.in_(sorted(ids)))
    if schedule is not None:
        where.append(table.c.name == schedule)
    return where


def _url(request: str) -> str:
    try:
        found = json.loads(request).get("url")
    except (ValueError, AttributeError):
        return ""
    return found if isinstance(found, str) else ""


_FOREVER = timedelta(days=366 * 100)
_PG_LOCK = text("SELECT pg_advisory_xact_lock(:key)")
# MariaDB/MySQL: a named lock per schedule (the database's name in it), released after.
_MY_LOCK = text(
    "SELECT GET_LOCK(CONCAT('pm:h:', LEFT(SHA2(CONCAT(DATABASE(), '/', :key), 256), 40)), 10)"
)
_MY_UNLOCK = text("DO RELEASE_ALL_LOCKS()")


def _lock_key(name: str) -> int:
    """A signed 64-bit advisory-lock key for a schedule's name (a collision only serialises)."""
    digest = hashlib.sha256(f"periodic_manager:http-overlap:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _new(ids: dict[str, int]) -> dict[str, tuple[int, bool]]:
    return {k: (i, True) for k, i in ids.items()}


async def _ids(
    conn: AsyncConnection, keys: Sequence[str], *, locking: bool = False
) -> dict[str, int]:
    found: dict[str, int] = {}
    for start in range(0, len(keys), CHUNK):
        stmt = select(table.c.idempotency_key, table.c.id).where(
            table.c.idempotency_key.in_(keys[start : start + CHUNK])
        )
        if locking:
            stmt = stmt.with_for_update(read=True)
        found.update({k: i for k, i in (await conn.execute(stmt)).all()})
    return found
