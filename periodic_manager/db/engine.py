"""Engine setup for PostgreSQL (asyncpg), SQLite (aiosqlite) and MariaDB/MySQL (asyncmy), and what
code outside ``db/`` holds of the database: an :data:`Engine`, and a :data:`Connection` it hands
to the functions of ``periodic_manager.db`` (the API, one per request). It never builds a
statement of its own. What differs per database is asked of :mod:`periodic_manager.db.dialects`
(the one registry); the predicates here (:func:`on_sqlite`, :func:`backend`, ...) read it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.db.dialects import DATABASES, backend_name, database_of, database_on

# Keeps IN (...) lists well under every driver's bind-parameter limit (asyncpg: 32767).
CHUNK = 500

_T = TypeVar("_T")

Engine = AsyncEngine
Connection = AsyncConnection


def normalize_url(url: str) -> str:
    """Accept plain ``postgresql://``, ``sqlite:///``, ``mysql://`` and ``mariadb://`` URLs and pick
    the async drivers (:meth:`Database.driver_url
    <periodic_manager.db.dialects.Database.driver_url>`); any other URL is left as it is."""
    u = make_url(url)
    for database in DATABASES.values():
        if u.drivername in database.schemes:
            u = database.driver_url(u)
            break
    return u.render_as_string(hide_password=False)


def url_backend(url: str) -> str:
    """``postgresql``, ``sqlite`` or ``mysql`` (MariaDB too): the database ``url`` names."""
    return backend_name(make_url(url).get_backend_name())


def is_sqlite(url: str) -> bool:
    return url_backend(url) == "sqlite"


def is_mysql(url: str) -> bool:
    """Whether ``url`` names a MariaDB or MySQL database."""
    return url_backend(url) == "mysql"


def create_engine(
    url: str, *, command_timeout: float = 10.0, ping: bool = True, **kwargs: Any
) -> AsyncEngine:
    """An async engine with sane production defaults, those of the database ``url`` names
    (:meth:`Database.engine <periodic_manager.db.dialects.Database.engine>`). SQLite: WAL and a
    busy timeout; PostgreSQL: a command timeout (``ping`` False: no pre-ping); MariaDB/MySQL:
    sessions in UTC."""
    url = normalize_url(url)
    return database_of(url).engine(url, command_timeout=command_timeout, ping=ping, **kwargs)


def backend(bind: AsyncEngine | AsyncConnection) -> str:
    """``postgresql``, ``sqlite`` or ``mysql`` (MariaDB too): the database ``bind`` talks to."""
    return backend_name(bind.dialect.name)


def on_sqlite(bind: AsyncEngine | AsyncConnection) -> bool:
    """Whether ``bind`` talks to SQLite (else PostgreSQL or MariaDB/MySQL)."""
    return backend(bind) == "sqlite"


def on_mysql(bind: AsyncEngine | AsyncConnection) -> bool:
    """Whether ``bind`` talks to MariaDB or MySQL."""
    return backend(bind) == "mysql"


def reads_bytes(bind: AsyncEngine | AsyncConnection) -> bool:
    """Whether untrusted columns are read as their stored bytes (:mod:`periodic_manager.db.rows`):
    on SQLite and MariaDB/MySQL (instants as their ISO text); PostgreSQL enforces its types."""
    return database_on(bind).reads_bytes


def chunks(items: Sequence[_T], size: int = CHUNK) -> Iterator[Sequence[_T]]:
    """``items`` in slices of ``size`` (:data:`CHUNK`): one IN (...) list each, so that no
    statement goes over a driver's bind-parameter limit however many values there are."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


# MariaDB/MySQL's answers that ask a transaction to be run again: a deadlock it broke, a lock wait
# it gave up (InnoDB rolls the statement or the transaction back; the whole transaction is retried).
RETRY_CODES = frozenset({1213, 1205})
RETRIES = 8
RETRY_PAUSE_S = 0.01  # the first pause's bound; each retry doubles it (0.01 s .. 1.28 s)


def must_retry(exc: BaseException) -> bool:
    """Whether ``exc`` is MariaDB/MySQL asking for the transaction to be run again."""
    if not isinstance(exc, DBAPIError):
        return False
    args = exc.orig.args if isinstance(exc.orig, BaseException) else ()
    return bool(args) and args[0] in RETRY_CODES


async def retried(conn: AsyncConnection, work: Callable[[], Awaitable[_T]]) -> _T:
    """``work()`` on ``conn``, run again (after a rollback) while MariaDB/MySQL answers that the
    transaction must be retried (a deadlock between concurrent writers), at most RETRIES times.
    Each retry waits a random pause, doubling its bound every time: writers that deadlocked
    together and retried at once would meet again in the same locks (eight concurrent creators
    of one calendar did, five times in a row)."""
    for attempt in range(RETRIES):
        try:
            return await work()
        except Exception as exc:
            if attempt == RETRIES - 1 or not must_retry(exc):
                raise
            await conn.rollback()
            await asyncio.sleep(random.uniform(0, RETRY_PAUSE_S * 2**attempt))
    raise AssertionError("unreachable")
