"""SQLite (aiosqlite): one process, one manager; no session locks, no LISTEN, no partitions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Table, event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from periodic_manager.db.dialects.base import (
    Assign,
    Database,
    SessionLock,
    Where,
    on_conflict_update,
)

SQLITE_BUSY_TIMEOUT_MS = 10_000


class SQLite(Database):
    """SQLite: the manager is always the leader; its own writes sync at once."""

    name, label, driver = "sqlite", "sqlite", "sqlite+aiosqlite"
    schemes = ("sqlite", "sqlite+pysqlite")

    def engine(self, url: str, *, command_timeout: float, ping: bool, **kwargs: Any) -> AsyncEngine:
        """WAL and a busy timeout so the API and the manager can write from one process."""
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

    def leader_lock(self, url: str, *, name: str, timeout: float) -> SessionLock:
        raise ValueError(
            "leader election needs PostgreSQL or MariaDB/MySQL; run one manager on SQLite"
        )

    def upsert(self, table: Table, keys: Iterable[str], assign: Assign, where: Where | None) -> Any:
        from sqlalchemy.dialects import sqlite

        return on_conflict_update(sqlite.insert(table), table, keys, assign, where)


DATABASE = SQLite()
