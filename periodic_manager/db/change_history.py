"""``pm_schedule_changes``, the change history of ``periodic_jobs``: who changed a schedule, when,
how, and each tracked column before and after.

Written by the triggers of migration 0012 on both databases (so plain SQL is seen, as ``sql``).
The schedule writer marks its own statements (:class:`Author`: ``api``, ``import``, ``manager``,
with an actor where one is known) through :func:`mark` before them and :func:`stamp` after them:
on PostgreSQL as transaction-local settings the trigger reads; on SQLite, where a trigger cannot
be told, by rewriting the source, actor and time of the rows its statements added (the writer
holds the database's write lock for the whole transaction, so those are the rows with a larger
id than before it wrote).

Only what a person changes is tracked (:data:`TRACKED`): the content columns, ``enabled``,
``description`` and ``paused_note``. The bookkeeping columns (``revision``, ``created_at``,
``updated_at``, ``effective_at``, ``paused_at``, ``paused_by``) never make an entry: the time and
source of an entry say what they would.

Bounded by the manager's store (``DatabaseRuntimeStore``): entries older than the retention go
(:func:`drop_old`) and each schedule keeps its newest ``per_schedule`` (:func:`cap`). Entries
outlive their row: a deleted schedule's history (ending in ``deleted``) stays until pruned.

Every cell is read as untrusted (the table is as writable as any other): an unreadable value is
None, never an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import func, literal, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.db import history
from periodic_manager.db import rows as dbrows
from periodic_manager.db.engine import on_mysql, on_sqlite, reads_bytes
from periodic_manager.db.models import schedule_changes_table

# The columns whose change is an entry (migration 0012 holds the same list, frozen).
TRACKED = (*dbrows.CONTENT, "enabled", "description", "paused_note")
CUT = 2000  # characters of a value kept (migration 0012)
_CHANGES_MAX = 200_000  # characters of a changes cell read; a longer one (not ours) is unreadable
_CAP_SCHEDULES = 5000  # schedules over their cap handled per prune
_US = timedelta(microseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MAX_US = 10**16 - 1  # the trigger reads at most 16 digits

Source = Literal["api", "import", "manager"]
C = schedule_changes_table.c


@dataclass(frozen=True, slots=True)
class Author:
    """Who writes through the schedule writer: its source and, where known, its actor (the
    API's tokens have no names: None; the manager: its id)."""

    source: Source
    actor: str | None = None


API = Author("api")
IMPORT = Author("import")


# -- marking the writer's statements --------------------------------------------------------------


async def mark(conn: AsyncConnection, author: Author, now: datetime) -> int | None:
    """Before the writer's statements, in its transaction. PostgreSQL: the settings the trigger
    reads (to commit or rollback). MariaDB/MySQL: the session variables the trigger reads
    (cleared by :func:`unmark`). SQLite (the caller holds the write lock): the largest entry id,
    for :func:`stamp`."""
    if on_sqlite(conn):
        return int((await conn.execute(select(func.coalesce(func.max(C.id), 0)))).scalar_one())
    micros = (now - _EPOCH) // _US
    at = str(micros) if 0 <= micros <= _MAX_US else ""
    if on_mysql(conn):
        await conn.execute(
            text("SET @pm_source = :source, @pm_actor = :actor, @pm_at = :at"),
            {"source": author.source, "actor": author.actor or "", "at": at},
        )
        return None
    settings = [
        func.set_config(literal("periodic_manager.source"), literal(author.source), True),
        func.set_config(literal("periodic_manager.actor"), literal(author.actor or ""), True),
        func.set_config(literal("periodic_manager.at"), literal(at), True),
    ]
    await conn.execute(select(*settings))
    return None


async def stamp(conn: AsyncConnection, author: Author, now: datetime, since: int | None) -> None:
    """After the writer's statements, in its transaction: on SQLite, the entries they added
    (id above ``since``) get the author and the writer's time. PostgreSQL: nothing to do."""
    if since is None:
        return
    values = {"source": author.source, "actor": author.actor, "at": now}
    await conn.execute(update(schedule_changes_table).where(C.id > since).values(**values))


async def unmark(conn: AsyncConnection) -> None:
    """MariaDB/MySQL: clear what :func:`mark` set (session variables outlive the transaction, and
    the connection goes back to the pool). Elsewhere nothing."""
    if on_mysql(conn):
        await conn.execute(text("SET @pm_source = NULL, @pm_actor = NULL, @pm_at = NULL"))


# -- bounds (the manager's store) -----------------------------------------------------------------


async def drop_old(engine: AsyncEngine, cutoff: datetime) -> int:
    """Delete entries with ``at`` before ``cutoff`` in bounded batches; the number deleted."""
    return await history.drop_before(engine, schedule_changes_table, C.id, C.at, cutoff)


async def cap(engine: AsyncEngine, per_schedule: int) -> int:
    """Keep the newest ``per_schedule`` entries of every schedule that has more (at most
    ``_CAP_SCHEDULES`` schedules per call; the rest at the next); the number deleted."""
    over = (
        select(C.schedule_id)
        .group_by(C.schedule_id)
        .having(func.count() > per_schedule)
        .limit(_CAP_SCHEDULES)
    )
    async with engine.connect() as conn:
        ids = [
            i for v in (await conn.execute(over)).scalars() if (i := dbrows.int_of(v)) is not None
        ]
    return await history.keep_newest(
        engine, schedule_changes_table, C.id, C.schedule_id, (C.id.desc(),), ids, per_schedule
    )


# -- reading (the API) ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FieldChange:
    """One column's change: its values before and after (None: NULL, absent or unreadable)."""

    before: Any
    after: Any
    truncated: bool


@dataclass(frozen=True, slots=True)
class ChangeRow:
    """An entry as the API shows it, decoded cell by cell. ``changes`` None: unreadable."""

    id: int
    schedule_id: int
    name: str | None
    at: datetime | None
    action: str
    source: str
    actor: str | None
    changes: dict[str, FieldChange] | None


async def page(
    conn: AsyncConnection, schedule_id: int, *, limit: int, offset: int
) -> tuple[int, list[ChangeRow]]:
    """How many entries the schedule has, and a page of them, the newest first."""
    where = C.schedule_id == schedule_id
    total = (
        await conn.execute(select(func.count()).select_from(schedule_changes_table).where(where))
    ).scalar_one()
    sqlite = reads_bytes(conn)
    columns = [dbrows.raw(sqlite, c).label(c.name) for c in schedule_changes_table.c]
    stmt = select(*columns).where(where).order_by(C.id.desc()).limit(limit).offset(offset)
    return int(total), [_row(sqlite, r) for r in (await conn.execute(stmt)).all()]


def _row(sqlite: bool, r: Any) -> ChangeRow:
    return ChangeRow(
        id=int(r.id),
        schedule_id=dbrows.int_of(r.schedule_id) or 0,
        name=dbrows.text_of(r.name),
        at=dbrows.instant_or_none(sqlite, r.at),
        action=dbrows.text_of(r.action) or "",
        source=dbrows.text_of(r.source) or "",
        actor=dbrows.text_of(r.actor),
        changes=changes_of(dbrows.text_of(r.changes)),
    )


def changes_of(text: str | None) -> dict[str, FieldChange] | None:
    """The ``changes`` cell: ``{column: FieldChange}`` for every tracked column it holds in the
    shape the triggers write; None when it is not such an object at all."""
    if text is None or len(text) > _CHANGES_MAX:
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    out: dict[str, FieldChange] = {}
    for column, item in doc.items():
        if column not in TRACKED or not isinstance(item, dict):
            continue
        truncated = item.get("truncated") is True
        out[column] = FieldChange(
            before=value_of(column, item.get("before"), truncated),
            after=value_of(column, item.get("after"), truncated),
            truncated=truncated,
        )
    return out


def value_of(column: str, text: Any, truncated: bool) -> Any:
    """A column's stored text as a person reads it: ``enabled`` a boolean, ``payload`` and
    ``options`` their JSON value, ``anchor`` an ISO-8601 UTC instant, where the text is one;
    otherwise the text as stored (cut when ``truncated``)."""
    if not isinstance(text, str):
        return None
    if column == "enabled":
        return {"1": True, "true": True, "t": True, "0": False, "false": False, "f": False}.get(
            text.strip().lower(), text
        )
    if column in ("payload", "options") and not truncated:
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            return text
    if column == "anchor":
        try:
            instant = datetime.fromisoformat(text.strip())
            if instant.tzinfo is None:
                instant = instant.replace(tzinfo=UTC)  # SQLite keeps instants as UTC
            return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")
        except (ValueError, OverflowError):
            return text
    return text
