"""PostgreSQL (asyncpg): its engine, its advisory lock of a session, and the dedicated
connections the runtime holds (leader lock, LISTEN, partition leases: :mod:`..leases`).

Every PostgreSQL connection of the manager is opened through :func:`pg_connect`.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Table, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from periodic_manager.db.dialects.base import (
    Assign,
    ChangeSignalKind,
    Database,
    SessionLock,
    Where,
    lock_key,
    on_conflict_update,
)

# The TCP keepalives of a dedicated connection's socket (Linux names; those the platform lacks
# are skipped): the first probe after 10 s of silence, then every 5 s, the connection dropped
# after 3 unanswered (and any data unacknowledged for 25 s ends it too). The kernel sends them:
# the process never wakes.
KEEPALIVE = {"TCP_KEEPIDLE": 10, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 3, "TCP_USER_TIMEOUT": 25_000}


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


def plain_dsn(url: str) -> str:
    """``url`` as asyncpg takes it (no SQLAlchemy driver name)."""
    return url.replace("postgresql+asyncpg://", "postgresql://")


async def session(
    dsn: str,
    *,
    connect_s: float,
    settings: dict[str, str],
    ended: Callable[[Any], None] | None = None,
) -> Any:
    """A dedicated connection (opened within ``connect_s``) with the server ``settings``
    (``application_name`` among them); ``ended(conn)`` is called when the server or the network
    ends it."""
    conn = await pg_connect(plain_dsn(dsn), timeout=connect_s, server_settings=settings)
    if ended is not None:
        conn.add_termination_listener(ended)
    return conn


def keep_alive(conn: Any) -> bool:
    """Turn on TCP keepalives (:data:`KEEPALIVE`) on an asyncpg connection's socket; False when
    it has none to set them on (a Unix socket, or a driver that does not expose it)."""
    transport = getattr(conn, "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in KEEPALIVE.items():
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
    return True


async def listen(conn: Any, channel: str, on_payload: Callable[[str], None]) -> None:
    """LISTEN on ``channel``: ``on_payload(payload)`` for every notification."""

    def notified(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
        on_payload(payload)

    await conn.add_listener(channel, notified)


async def probe(conn: Any) -> None:
    """One round trip on ``conn`` (raises when the session is gone)."""
    await conn.fetchval("SELECT 1")


def terminate(conn: Any) -> None:
    """Drop ``conn`` at once, without a round trip."""
    conn.terminate()


class AdvisoryLock:
    """The leader lock: ``pg_try_advisory_lock`` on ``key``, on a connection whose server ends
    it (and frees the lock) once silent for ``timeout`` (``idle_session_timeout`` and TCP
    keepalives)."""

    def __init__(self, dsn: str, *, key: int, timeout: float) -> None:
        self.dsn = plain_dsn(dsn)
        self.key = key
        self.timeout = timeout

    async def connect(self) -> Any:
        return await session(
            self.dsn,
            connect_s=self.timeout,
            settings={
                "application_name": "periodic_manager leader",
                # The server ends our session (and frees the lock) when we go silent.
                "idle_session_timeout": str(int(self.timeout * 1000)),
                "tcp_keepalives_idle": str(max(1, int(self.timeout / 3))),
                "tcp_keepalives_interval": "1",
                "tcp_keepalives_count": "2",
            },
        )

    async def try_lock(self, conn: Any) -> bool:
        return bool(await conn.fetchval("SELECT pg_try_advisory_lock($1::bigint)", self.key))

    async def prove(self, conn: Any) -> None:
        await probe(conn)

    async def close(self, conn: Any) -> None:
        await conn.close()

    def terminate(self, conn: Any) -> None:
        terminate(conn)


def _closed_is_stale(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
    """A pooled asyncpg connection that the server closed is replaced at checkout (the pool
    retries with a new one), without a round trip."""
    if dbapi_conn.driver_connection.is_closed():
        raise DisconnectionError("the server closed this pooled connection")


class PostgreSQL(Database):
    """PostgreSQL: LISTEN/NOTIFY, advisory locks, partition leases, typed columns."""

    name, label, driver = "postgresql", "postgresql", "postgresql+asyncpg"
    schemes = ("postgresql", "postgres", "postgresql+psycopg2", "postgresql+psycopg")
    change_signal: ChangeSignalKind = "listen"
    partitions = elects_leader = True
    reads_bytes = False

    def engine(self, url: str, *, command_timeout: float, ping: bool, **kwargs: Any) -> AsyncEngine:
        """A command timeout so a half-open connection cannot freeze the schedule. ``ping``
        False (the manager's own pool): no round trips before each checkout (a pre-ping is
        three: BEGIN, SELECT 1, ROLLBACK, at every heartbeat); a pooled connection the server
        closed (a restart, a terminated backend) is still replaced at checkout, seen without a
        round trip, and any other failure is the caller's to retry, as every loop of the
        manager does."""
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

    def leader_lock(self, url: str, *, name: str, timeout: float) -> SessionLock:
        return AdvisoryLock(url, key=lock_key(name), timeout=timeout)

    def upsert(self, table: Table, keys: Iterable[str], assign: Assign, where: Where | None) -> Any:
        from sqlalchemy.dialects import postgresql

        return on_conflict_update(postgresql.insert(table), table, keys, assign, where)


DATABASE = PostgreSQL()
