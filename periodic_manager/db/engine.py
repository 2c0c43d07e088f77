"""Engine setup for PostgreSQL (asyncpg), SQLite (aiosqlite) and MariaDB/MySQL (asyncmy), and what
code outside ``db/``
holds of the database: an :data:`Engine`, and a :data:`Connection` it hands to the functions of
``periodic_manager.db`` (the API, one per request). It never builds a statement of its own."""

from __future__ import annotations

import asyncio
import importlib.util
import random
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

SQLITE_BUSY_TIMEOUT_MS = 10_000
# Keeps IN (...) lists well under every driver's bind-parameter limit (asyncpg: 32767).
CHUNK = 500

_T = TypeVar("_T")

Engine = AsyncEngine
Connection = AsyncConnection


# URL schemes of MariaDB and MySQL (both spoken by the asyncmy driver).
MYSQL_SCHEMES = (
    "mysql",
    "mariadb",
    "mysql+asyncmy",
    "mariadb+asyncmy",
    "mysql+pymysql",
    "mysql+aiomysql",
)
MYSQL_EXTRA = (
    "the MariaDB/MySQL driver asyncmy is not installed: pip install 'periodic-manager[mysql]'"
)


def normalize_url(url: str) -> str:
    """Accept plain ``postgresql://``, ``sqlite:///``, ``mysql://`` and ``mariadb://`` URLs and pick
    the async drivers (MariaDB/MySQL: asyncmy, charset utf8mb4)."""
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres", "postgresql+psycopg2", "postgresql+psycopg"):
        u = u.set(drivername="postgresql+asyncpg")
    elif u.drivername in ("sqlite", "sqlite+pysqlite"):
        u = u.set(drivername="sqlite+aiosqlite")
    elif u.drivername in MYSQL_SCHEMES:
        u = u.set(drivername="mysql+asyncmy").update_query_dict({"charset": "utf8mb4"})
    return u.render_as_string(hide_password=False)


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def is_mysql(url: str) -> bool:
    """Whether ``url`` names a MariaDB or MySQL database."""
    return make_url(url).get_backend_name() in ("mysql", "mariadb")


def url_backend(url: str) -> str:
    """``postgresql``, ``sqlite`` or ``mysql`` (MariaDB too): the database ``url`` names."""
    return "mysql" if is_mysql(url) else make_url(url).get_backend_name()


def check_mysql_driver() -> None:
    """Raise ValueError (one line naming the extra) when asyncmy is not installed."""
    if importlib.util.find_spec("asyncmy") is None:
        raise ValueError(MYSQL_EXTRA)


def create_engine(
    url: str, *, command_timeout: float = 10.0, ping: bool = True, **kwargs: Any
) -> AsyncEngine:
    """An async engine with sane production defaults.

    SQLite: WAL and a busy timeout so the API and the manager can write from one process.
    PostgreSQL: a command timeout so a half-open connection cannot freeze the schedule.
    ``ping`` False (PostgreSQL, the manager's own pool): no round trips before each checkout
    (a pre-ping is three: BEGIN, SELECT 1, ROLLBACK, at every heartbeat); a pooled connection
    the server closed (a restart, a terminated backend) is still replaced at checkout, seen
    without a round trip, and any other failure is the caller's to retry, as every loop of the
    manager does.
    """
    url = normalize_url(url)
    if is_sqlite(url):
        engine = create_async_engine(
            url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **kwargs
        )

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    if is_mysql(url):
        check_mysql_driver()
        # Sessions in UTC: DATETIME(6) columns hold UTC, and NOW() in the triggers is UTC too.
        mysql_args: dict[str, Any] = {
            "connect_timeout": command_timeout,
            "init_command": "SET time_zone = '+00:00'",
        }
        mysql_args.update(kwargs.pop("connect_args", {}))
        kwargs.setdefault("pool_pre_ping", True)
        kwargs.setdefault("pool_recycle", 3600)
        return create_async_engine(url, connect_args=mysql_args, **kwargs)
    connect_args: dict[str, Any] = {
        "command_timeout": command_timeout,
        "timeout": command_timeout,
        "async_creator_fn": pg_connect,
    }
    connect_args.update(kwargs.pop("connect_args", {}))
    kwargs.setdefault("pool_pre_ping", ping)
    engine = create_async_engine(url, connect_args=connect_args, **kwargs)
    if not kwargs["pool_pre_ping"]:
        event.listen(engine.sync_engine.pool, "checkout", _closed_is_stale)
    return engine


def _closed_is_stale(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
    """A pooled asyncpg connection that the server closed is replaced at checkout (the pool
    retries with a new one), without a round trip."""
    if dbapi_conn.driver_connection.is_closed():
        raise DisconnectionError("the server closed this pooled connection")


async def pg_connect(*args: Any, **kwargs: Any) -> Any:
    """``asyncpg.connect``, safe to cancel: every PostgreSQL connection of the manager (the
    engine's pool, leadership, partition leases, LISTEN) is opened through it.

    asyncpg's connect cancelled at one point of its opening (the socket connected, the TLS probe
    not yet answered: ``sslmode=prefer``, the default, always probes) leaves a future that
    later fails with nobody to read it, and asyncio logs that at ERROR ("Future exception was
    never retrieved"). A stop cancels whatever is connecting at that moment, so a clean stop
    logged an ERROR now and then. Here the connect itself is never cancelled: the caller's
    cancellation is raised at once, and the connect left behind ends by itself (bounded by its
    ``timeout``) and its connection is dropped."""
    import asyncpg

    connecting = asyncio.ensure_future(asyncpg.connect(*args, **kwargs))
    try:
        return await asyncio.shield(connecting)
    except asyncio.CancelledError:
        connecting.add_done_callback(_drop_abandoned)
        raise


def _drop_abandoned(connecting: asyncio.Future[Any]) -> None:
    if connecting.cancelled() or connecting.exception() is not None:
        return  # the exception is read: nothing is logged for a connect nobody waits for
    connecting.result().terminate()


def on_sqlite(bind: AsyncEngine | AsyncConnection) -> bool:
    """Whether ``bind`` talks to SQLite (else PostgreSQL or MariaDB/MySQL)."""
    return bind.dialect.name == "sqlite"


def on_mysql(bind: AsyncEngine | AsyncConnection) -> bool:
    """Whether ``bind`` talks to MariaDB or MySQL."""
    return bind.dialect.name in ("mysql", "mariadb")


def backend(bind: AsyncEngine | AsyncConnection) -> str:
    """``postgresql``, ``sqlite`` or ``mysql`` (MariaDB too): the database ``bind`` talks to."""
    return "mysql" if on_mysql(bind) else bind.dialect.name


def reads_bytes(bind: AsyncEngine | AsyncConnection) -> bool:
    """Whether untrusted columns are read as their stored bytes (:mod:`periodic_manager.db.rows`):
    on SQLite and MariaDB/MySQL (instants as their ISO text); PostgreSQL enforces its types."""
    return bind.dialect.name != "postgresql"


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
