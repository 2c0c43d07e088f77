"""MariaDB and MySQL (asyncmy): their engine, their named lock of a session (``GET_LOCK``) and
their upsert (``ON DUPLICATE KEY UPDATE``). No LISTEN: the manager polls the change revision;
no partition leases: one leader holds every schedule."""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Table, case
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from periodic_manager.db.dialects.base import Assign, ChangeSignalKind, Database, SessionLock, Where

MYSQL_EXTRA = (
    "the MariaDB/MySQL driver asyncmy is not installed: pip install 'periodic-manager[mysql]'"
)


class NamedLock:
    """The leader lock: ``GET_LOCK`` on a dedicated asyncmy connection whose server ends it
    (and frees the lock) once silent for ``timeout`` (``wait_timeout``, whole seconds, at least
    1). Named locks belong to the server, not to a database: the lock's name is derived from the
    database's name and ``name``, so deployments on other databases of the same server do not
    share it."""

    def __init__(self, url: str, *, name: str, timeout: float) -> None:
        self.url = make_url(url)
        self.timeout = timeout
        database = self.url.database or ""
        # At most 64 characters (the servers' limit on a lock name).
        self.name = "pm:" + hashlib.sha256(f"{database}/{name}".encode()).hexdigest()[:40]

    async def connect(self) -> Any:
        import asyncmy

        u = self.url
        # The server ends our session (and frees the lock) once we are silent this long.
        wait = max(1, int(self.timeout))
        return await asyncmy.connect(
            host=u.host or "127.0.0.1",
            port=u.port or 3306,
            user=u.username or "",
            password=u.password or "",
            database=u.database,
            connect_timeout=self.timeout,
            autocommit=True,
            init_command=f"SET SESSION wait_timeout = {wait}",
        )

    @staticmethod
    async def _fetch(conn: Any, sql: str, *args: Any) -> Any:
        async with conn.cursor() as cur:
            await cur.execute(sql, args)
            row = await cur.fetchone()
        return None if row is None else row[0]

    async def try_lock(self, conn: Any) -> bool:
        return await self._fetch(conn, "SELECT GET_LOCK(%s, 0)", self.name) == 1

    async def prove(self, conn: Any) -> None:
        # Stronger than a round trip: the lock is this session's.
        if await self._fetch(conn, "SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", self.name) != 1:
            raise RuntimeError("the named lock is no longer this session's")

    async def close(self, conn: Any) -> None:
        await conn.ensure_closed()

    def terminate(self, conn: Any) -> None:
        conn.close()


class MySQL(Database):
    """MariaDB and MySQL: named locks, a polled change revision, no partitions."""

    name, label, driver = "mysql", "mysql/mariadb", "mysql+asyncmy"
    schemes = (
        "mysql",
        "mariadb",
        "mysql+asyncmy",
        "mariadb+asyncmy",
        "mysql+pymysql",
        "mysql+aiomysql",
    )
    change_signal: ChangeSignalKind = "poll"
    elects_leader = True

    def check_driver(self) -> None:
        """An extra of the package: ``pip install 'periodic-manager[mysql]'``."""
        if importlib.util.find_spec("asyncmy") is None:
            raise ValueError(MYSQL_EXTRA)

    def driver_url(self, url: URL) -> URL:
        """asyncmy, charset utf8mb4."""
        return url.set(drivername=self.driver).update_query_dict({"charset": "utf8mb4"})

    def engine(self, url: str, *, command_timeout: float, ping: bool, **kwargs: Any) -> AsyncEngine:
        self.check_driver()
        # Sessions in UTC: DATETIME(6) columns hold UTC, and NOW() in the triggers is UTC too.
        mysql_args: dict[str, Any] = {
            "connect_timeout": command_timeout,
            "init_command": "SET time_zone = '+00:00'",
        }
        mysql_args.update(kwargs.pop("connect_args", {}))
        kwargs.setdefault("pool_pre_ping", True)
        kwargs.setdefault("pool_recycle", 3600)
        return create_async_engine(url, connect_args=mysql_args, **kwargs)

    def leader_lock(self, url: str, *, name: str, timeout: float) -> SessionLock:
        return NamedLock(url, name=name, timeout=timeout)

    def upsert(self, table: Table, keys: Iterable[str], assign: Assign, where: Where | None) -> Any:
        """``ON DUPLICATE KEY UPDATE`` (``keys`` are the table's unique keys there); a ``where``
        becomes a choice per column between the new value and the stored one."""
        from sqlalchemy.dialects import mysql

        stmt = mysql.insert(table)
        new = stmt.inserted
        pairs = list(assign(new))
        if where is not None:
            cond = where(new)
            pairs = [(name, case((cond, value), else_=table.c[name])) for name, value in pairs]
        return stmt.on_duplicate_key_update(pairs)


DATABASE = MySQL()
