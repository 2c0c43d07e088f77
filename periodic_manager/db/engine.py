"""Engine setup for PostgreSQL (asyncpg) and SQLite (aiosqlite), and what code outside ``db/``
holds of the database: an :data:`Engine`, and a :data:`Connection` it hands to the functions of
``periodic_manager.db`` (the API, one per request). It never builds a statement of its own."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

SQLITE_BUSY_TIMEOUT_MS = 10_000
# Keeps IN (...) lists well under every driver's bind-parameter limit (asyncpg: 32767).
CHUNK = 500

_T = TypeVar("_T")

Engine = AsyncEngine
Connection = AsyncConnection


def normalize_url(url: str) -> str:
    """Accept plain ``postgresql://`` and ``sqlite:///`` URLs and pick the async drivers."""
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres", "postgresql+psycopg2", "postgresql+psycopg"):
        u = u.set(drivername="postgresql+asyncpg")
    elif u.drivername in ("sqlite", "sqlite+pysqlite"):
        u = u.set(drivername="sqlite+aiosqlite")
    return u.render_as_string(hide_password=False)


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def create_engine(url: str, *, command_timeout: float = 10.0, **kwargs: Any) -> AsyncEngine:
    """An async engine with sane production defaults.

    SQLite: WAL and a busy timeout so the API and the manager can write from one process.
    PostgreSQL: a command timeout so a half-open connection cannot freeze the schedule.
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
    connect_args = {"command_timeout": command_timeout, "timeout": command_timeout}
    connect_args.update(kwargs.pop("connect_args", {}))
    kwargs.setdefault("pool_pre_ping", True)
    return create_async_engine(url, connect_args=connect_args, **kwargs)


def on_sqlite(bind: AsyncEngine | AsyncConnection) -> bool:
    """Whether ``bind`` talks to SQLite (else PostgreSQL)."""
    return bind.dialect.name == "sqlite"


def chunks(items: Sequence[_T], size: int = CHUNK) -> Iterator[Sequence[_T]]:
    """``items`` in slices of ``size`` (:data:`CHUNK`): one IN (...) list each, so that no
    statement goes over a driver's bind-parameter limit however many values there are."""
    for i in range(0, len(items), size):
        yield items[i : i + size]
