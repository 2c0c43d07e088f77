"""Rows written the way anyone with database access writes them: raw SQL through the drivers
themselves (asyncpg, sqlite3), no SQLAlchemy types, no JSON encoding, no validation.

Each hostile case is a set of column literals that the database accepts but no manager can
use, with the field its judgement must name. ``BOTH`` can be stored on every backend;
``POSTGRESQL``, ``SQLITE`` and ``MYSQL`` only there (SQLite columns take any value of any type;
PostgreSQL takes timestamps far outside Python's range; MariaDB/MySQL zero dates and any text
in a JSON column).
"""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import asyncpg

DEEP = "[" * 900 + "]" * 900  # valid JSON, nested 900 deep
DIGITS = "1" * 5000  # a JSON number beyond Python's 4,300-digit limit
LARGE = '"' + "x" * 70_000 + '"'  # 70 kB of JSON, over the default 64 KiB
HUGE_INT = "9" * 400  # math.isfinite() of it raises OverflowError


@dataclass(frozen=True)
class Case:
    label: str
    columns: dict[str, str]  # column -> SQL literal
    field: str  # the field the judgement names
    repair: dict[str, Any] = field(default_factory=dict)  # a PATCH body that fixes the row


BOTH = [
    Case("payload-5000-digits", {"payload": f"'{DIGITS}'"}, "payload", {"payload": 1}),
    Case("payload-900-deep", {"payload": f"'{DEEP}'"}, "payload", {"payload": [[1]]}),
    Case("payload-70kB", {"payload": f"'{LARGE}'"}, "payload", {"payload": "small"}),
    Case(
        "catchup-window-1e300",
        {"options": """'{"misfire": "fire_once", "catchup_window": 1e300}'"""},
        "options.catchup_window",
        {"options": {"misfire": "fire_once", "catchup_window": 600}},
    ),
    Case(
        "catchup-window-1e12-every-1s",
        {
            "spec": "'@every 1s'",
            "options": """'{"misfire": "fire_once", "catchup_window": 1e12}'""",
        },
        "options.catchup_window",
        {"options": {"misfire": "fire_once"}},
    ),
    Case(
        "timeout-400-digits",
        {"options": f"""'{{"timeout": {HUGE_INT}}}'"""},
        "options.timeout",
        {"options": {"timeout": 30}},
    ),
    Case(
        "unique-ttl-400-digits",
        {"options": f"""'{{"unique_ttl": {HUGE_INT}}}'"""},
        "options.unique_ttl",
        {"options": {}},
    ),
    Case(
        "extra-expires-1e300",
        {"options": """'{"extra": {"expires": 1e300}}'"""},
        "options.extra.expires",
        {"options": {"extra": {"expires": 60}}},
    ),
    Case("every-36501-days", {"spec": "'@every 36501d'"}, "spec", {"spec": "@every 1m"}),
]
POSTGRESQL = [
    Case("anchor-year-10000", {"anchor": "'10000-01-01 00:00:00+00'"}, "anchor", {"anchor": None}),
    Case("anchor-1-bc", {"anchor": "'0001-01-01 BC'"}, "anchor", {"anchor": None}),
    Case(
        "anchor-infinity",
        {"anchor": "'infinity'"},
        "anchor",
        {"anchor": "2024-01-01T00:00:00Z"},
    ),
]
SQLITE = [
    Case("payload-not-json", {"payload": "'not json {'"}, "payload", {"payload": None}),
    Case("options-not-json", {"options": "'queue=x'"}, "options", {"options": {}}),
    Case("options-array", {"options": "'[1]'"}, "options", {"options": {"queue": "q"}}),
    Case("anchor-not-iso", {"anchor": "'yesterday'"}, "anchor", {"anchor": None}),
    Case(
        "anchor-year-1-at-plus-14",
        {"anchor": "'0001-01-01T00:00:00+14:00'"},
        "anchor",
        {"anchor": None},
    ),
    Case("spec-not-utf8", {"spec": "X'FF'"}, "spec", {"spec": "* * * * *"}),
    Case("name-not-utf8", {"name": "X'FF00'"}, "name", {"name": "renamed"}),
    Case("payload-not-utf8", {"payload": "X'FFFE'"}, "payload", {"payload": {"a": 1}}),
    Case("options-not-utf8", {"options": "X'FF'"}, "options", {"options": {}}),
    Case("enabled-yes", {"enabled": "'yes'"}, "enabled", {"enabled": True}),
]


# MariaDB/MySQL: JSON columns are LONGTEXT (any text), DATETIME takes zero dates and years a
# schedule may not use, ``enabled`` is a TINYINT; text is checked as UTF-8 by the server.
MYSQL = [
    Case("payload-not-json", {"payload": "'not json {'"}, "payload", {"payload": None}),
    Case("options-not-json", {"options": "'queue=x'"}, "options", {"options": {}}),
    Case("options-array", {"options": "'[1]'"}, "options", {"options": {"queue": "q"}}),
    Case("anchor-zero-date", {"anchor": "'0000-00-00 00:00:00'"}, "anchor", {"anchor": None}),
    Case("anchor-zero-month", {"anchor": "'2024-00-10 00:00:00'"}, "anchor", {"anchor": None}),
    Case("anchor-9999-12-31", {"anchor": "'9999-12-31 23:59:59'"}, "anchor", {"anchor": None}),
    Case("enabled-2", {"enabled": "2"}, "enabled", {"enabled": True}),
]
EXTRA = {"postgresql": POSTGRESQL, "sqlite": SQLITE, "mysql": MYSQL}
BACKENDS = tuple(EXTRA)


def cases(backend: str) -> list[Case]:
    return BOTH + EXTRA[backend]


def all_cases() -> list[tuple[str, Case]]:
    """(backend, case) for every case on every backend that can hold it."""
    return [(b, c) for b in BACKENDS for c in cases(b)]


def case_id(pair: tuple[str, Case]) -> str:
    return f"{pair[0]}-{pair[1].label}"


async def execute(url: str, sql: str) -> list[tuple[Any, ...]]:
    """Run one statement with the backend's own driver; its rows (e.g. of RETURNING)."""
    if url.startswith("sqlite"):
        # In a thread: a manager running in this event loop may hold the write lock, and must
        # be able to commit while this statement waits for it.
        return await asyncio.to_thread(_sqlite_execute, url.split(":///", 1)[1], sql)
    if url.startswith("mysql"):
        return await _mysql_execute(url, sql)
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"), timeout=5)
    try:
        return [tuple(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()


async def _mysql_execute(url: str, sql: str) -> list[tuple[Any, ...]]:
    """MariaDB/MySQL through asyncmy, in a session of UTC (as the product's engine)."""
    import asyncmy
    from sqlalchemy.engine import make_url

    u = make_url(url)
    conn = await asyncmy.connect(
        host=u.host or "127.0.0.1",
        port=u.port or 3306,
        user=u.username or "root",
        password=u.password or "",
        database=u.database,
        autocommit=True,
        connect_timeout=5,
        charset="utf8mb4",
        init_command="SET time_zone = '+00:00'",
    )
    try:
        async with conn.cursor() as cur:
            await cur.execute(sql)
            rows = await cur.fetchall() if cur.description else ()
        return [tuple(r) for r in rows]
    finally:
        conn.close()


def _sqlite_execute(path: str, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path, timeout=10)) as db:
        rows = db.execute(sql).fetchall()
        db.commit()
    return [tuple(r) for r in rows]


def instant(url: str, utc: str) -> str:
    """The SQL literal of the UTC instant ``utc`` (``YYYY-MM-DD HH:MM:SS[.f]``) for the database
    at ``url``: with an offset on PostgreSQL; as it is on SQLite and MariaDB/MySQL, which hold
    UTC (MariaDB takes no offset in a literal)."""
    return f"'{utc}+00'" if url.startswith("postgresql") else f"'{utc}'"


async def insert(url: str, name: str, /, **columns: str) -> int:
    """Insert a row whose columns are SQL literals (defaults: a valid every-minute row)."""
    values = {"name": f"'{name}'", "spec": "'* * * * *'", "task_type": "'t'", **columns}
    sql = (
        f"INSERT INTO periodic_jobs ({', '.join(values)}) VALUES ({', '.join(values.values())})"
        " RETURNING id"
    )
    [(row_id,)] = await execute(url, sql)
    return int(row_id)
