"""``pm_last_good`` on PostgreSQL and SQLite: the last good versions of rows that turned bad
(see :mod:`periodic_manager.runtime.last_good`). ``DatabaseRuntimeStore`` offers these as its methods.

Versions are read back raw, column by column, exactly as rows of ``periodic_jobs`` are
(:func:`periodic_manager.db.rows.column`), so the row judge takes them as it takes a row: whatever
the table holds, reading it cannot fail and using it needs the judge's word.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, LargeBinary, bindparam, case, cast, delete, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.contracts import LastGoodVersion, StoredVersion
from periodic_manager.db import rows as dbrows
from periodic_manager.db.engine import chunks, reads_bytes
from periodic_manager.db.models import last_good_table
from periodic_manager.db.upsert import upsert

_T = last_good_table
# The columns of a version in the order the row judge reads a row's content (then effective_at).
_JUDGED = (*dbrows.CONTENT, "effective_at")


# The columns a version gives by its field of the same name (payload and options: their JSON).
_SAME_NAMED = tuple(c.name for c in _T.c if c.name not in ("payload", "options"))


def _values(v: LastGoodVersion) -> dict[str, Any]:
    values = {name: getattr(v, name) for name in _SAME_NAMED}
    return {**values, "payload": v.payload_json, "options": v.options_json}


async def save(engine: AsyncEngine, versions: Sequence[LastGoodVersion]) -> None:
    """Upsert ``versions``. A stored version seen bad at a later revision stays (a manager with an
    older view must not overwrite it); the same content keeps its ``since``."""
    if not versions:
        return
    t = _T.c

    def assign(new: Any) -> list[tuple[str, Any]]:
        # ``since`` reads the stored content_hash, the condition the stored bad_revision: both
        # are assigned after what reads them (MariaDB/MySQL assign in order; see db/upsert.py).
        out = [("since", case((t.content_hash == new.content_hash, t.since), else_=new.since))]
        last = ("content_hash", "bad_revision")
        out += [
            (c.name, new[c.name]) for c in _T.c if c.name not in ("schedule_key", "since", *last)
        ]
        return out + [(name, new[name]) for name in last]

    def newer(new: Any) -> Any:
        return or_(
            t.bad_revision.is_(None), new.bad_revision.is_(None), new.bad_revision >= t.bad_revision
        )

    stmt = upsert(engine, last_good_table, ["schedule_key"], assign, newer)
    async with engine.begin() as conn:
        await conn.execute(stmt, [_values(v) for v in versions])


async def index(engine: AsyncEngine) -> dict[str, int | None]:
    sqlite = reads_bytes(engine)
    async with engine.connect() as conn:
        rows = (await conn.execute(select(_key(sqlite), _T.c.bad_revision))).all()
    return {_text(key): _revision(rev) for key, rev in rows}


async def load(engine: AsyncEngine, keys: Sequence[str]) -> list[StoredVersion]:
    sqlite = reads_bytes(engine)
    query = select(
        _key(sqlite),
        *(dbrows.column(sqlite, name, _T) for name in _JUDGED),
        dbrows.raw_instant(sqlite, _T.c.since),
        _T.c.bad_revision,
    ).where(_T.c.schedule_key.in_(bindparam("keys", expanding=True)))
    out: list[StoredVersion] = []
    async with engine.connect() as conn:
        for part in chunks(keys):
            for row in (await conn.execute(query, {"keys": list(part)})).all():
                key, *raw, since, bad = row
                out.append(
                    StoredVersion(
                        schedule_key=_text(key),
                        raw=tuple(raw),
                        since=dbrows.instant_or_none(sqlite, since),
                        bad_revision=_revision(bad),
                    )
                )
    return out


def _key(sqlite: bool) -> Any:
    # SQLite: the stored bytes (text that is not UTF-8 would fail the whole read).
    return cast(_T.c.schedule_key, LargeBinary) if sqlite else _T.c.schedule_key


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _revision(value: Any) -> int | None:
    return value if type(value) is int else None


async def forget(engine: AsyncEngine, keys: Sequence[str], revision: int | None) -> None:
    stale: ColumnElement[bool] = _T.c.schedule_key.in_(bindparam("keys", expanding=True))
    if revision is not None:
        stale = stale & or_(_T.c.bad_revision.is_(None), _T.c.bad_revision <= revision)
    stmt = delete(last_good_table).where(stale)
    async with engine.begin() as conn:
        for part in chunks(keys):
            await conn.execute(stmt, {"keys": list(part)})
