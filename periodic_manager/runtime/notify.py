"""Change signals: PostgreSQL LISTEN on a dedicated connection, turned into sync requests.

A trigger on ``periodic_jobs`` NOTIFYs channel ``periodic_jobs`` once per statement (migrations
0003 and 0016), so API edits, raw SQL and bulk UPDATEs all wake the manager. The payload lists
the partitions of the rows the statement changed (``3,17``), or is empty when anything may have
changed (TRUNCATE, a list too long for one notification); the listener hands them on
(:func:`partitions_of`) and the manager syncs only when it holds one of them. Its sync reads
what changed, and bursts coalesce into one sync because a request only sets an event.

LISTEN needs a long-lived connection of its own (not one borrowed from a pool). When it drops,
the listener reconnects with capped backoff and asks for a sync at once, since notifications sent
while it was away are lost.

A lost connection is noticed without a round trip of the manager's: a connection closed by the
server or by a reset ends with asyncpg's termination callback, and a half-open one (the server's
host or the network gone silent) is ended by the kernel's TCP keepalives on that socket
(:data:`KEEPALIVE`: within about 25 s of silence), which ends it the same way. A ``SELECT 1``
probe every ``check_interval`` (60 s) remains as the backstop (a socket whose options could not
be set, a server that answers the keepalives but no query); the sync loop's periodic read is the
last one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

from periodic_manager.clock import SystemClock, next_tick, sleep_unless
from periodic_manager.contracts import Clock, SignalCallback
from periodic_manager.runtime.tasks import cancel_loop, reraise_if_cancelled

log = logging.getLogger(__name__)

CHANNEL = "periodic_jobs"
# The LISTEN socket's TCP keepalives (Linux names; those the platform lacks are skipped): the first
# probe after 10 s of silence, then every 5 s, the connection dropped after 3 unanswered (and any
# data unacknowledged for 25 s ends it too). The kernel sends them: the process never wakes.
KEEPALIVE = {"TCP_KEEPIDLE": 10, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 3, "TCP_USER_TIMEOUT": 25_000}


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


def partitions_of(payload: str) -> frozenset[int] | None:
    """The partitions a notification's payload names; None (anything may have changed) when it
    is empty or not a list of partition numbers (the payload is data: never trusted)."""
    try:
        parts = frozenset(int(p) for p in payload.split(","))
    except ValueError:
        return None
    return parts if all(0 <= p for p in parts) else None


class PostgresChangeListener:
    """Calls ``on_change(partitions)`` (given to :meth:`start`) for every notification on
    ``channel``, and ``on_change(None)`` after every reconnect."""

    def __init__(
        self,
        dsn: str,
        *,
        channel: str = CHANNEL,
        clock: Clock | None = None,
        check_interval: float = 60.0,
        timeout: float = 5.0,
        max_backoff: float = 10.0,
    ) -> None:
        self.dsn = dsn.replace("postgresql+asyncpg://", "postgresql://")
        self.on_change: SignalCallback = lambda _parts: None
        self.channel = channel
        # Reconnect backoff and health checks use real time even under a virtual scheduler clock:
        # they wait for a server, not for a slot.
        self.clock: Clock = clock or SystemClock()
        self.check_interval = check_interval
        self.timeout = timeout
        self.max_backoff = max_backoff
        self.connected = asyncio.Event()
        self.reconnects = 0
        self.kept_alive = False  # the connection's socket has TCP keepalives (keep_alive)
        self._conn: Any = None
        self._task: asyncio.Task[None] | None = None
        self._lost = asyncio.Event()

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The background loop (the manager supervises it: its death is the manager's failure)."""
        return self._task

    async def start(self, on_change: SignalCallback) -> None:
        """Start listening in the background (returns at once)."""
        self.on_change = on_change
        self._task = asyncio.ensure_future(self._run())
        self._task.set_name("periodic-manager-listener")

    async def stop(self) -> None:
        await cancel_loop(self._task, self.timeout)
        self._task = None
        await self._close()

    async def _run(self) -> None:
        backoff = 0.2
        first = True
        while True:
            try:
                await self._connect()
            except Exception as exc:  # noqa: BLE001 - keep trying; the sync loop is the backstop
                reraise_if_cancelled(exc)
                log.warning(
                    "LISTEN %s: cannot connect (retrying in %.1f s): %s", self.channel, backoff, exc
                )
                await self.clock.sleep(backoff)
                backoff = min(self.max_backoff, backoff * 2)
                continue
            backoff = 0.2
            if not first:
                self.reconnects += 1
                log.info("LISTEN %s: reconnected", self.channel)
            first = False
            # Anything may have changed while no connection was listening.
            self.on_change(None)
            await self._watch()
            await self._close()

    async def _connect(self) -> None:
        from periodic_manager.db.engine import pg_connect

        # An event per connection: asyncpg calls a connection's termination callbacks a loop turn
        # after it ends (the one this listener dropped included), by then this connect is under
        # way, and a shared event would end the next connection too (then each the next).
        lost = self._lost = asyncio.Event()
        conn = await pg_connect(
            self.dsn,
            timeout=self.timeout,
            server_settings={"application_name": "periodic_manager listener"},
        )
        conn.add_termination_listener(lambda _c: lost.set())
        try:
            self.kept_alive = keep_alive(conn)
        except OSError as exc:  # the probe is the backstop
            log.warning("LISTEN %s: cannot set TCP keepalives: %s", self.channel, exc)
            self.kept_alive = False
        await conn.add_listener(self.channel, self._notified)
        self._conn = conn
        self.connected.set()

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self.on_change(partitions_of(payload))

    async def _watch(self) -> None:
        """Return when the connection is lost (termination callback, which TCP keepalives
        bring on a half-open socket too, or a failed probe every ``check_interval``)."""
        while not self._lost.is_set():
            if await sleep_unless(
                self.clock, self._lost, until=next_tick(self.clock.now(), self.check_interval)
            ):
                break
            try:
                async with asyncio.timeout(self.timeout):  # no task of its own, as wait_for makes
                    await self._conn.fetchval("SELECT 1")
            except Exception as exc:  # noqa: BLE001
                reraise_if_cancelled(exc)
                log.warning("LISTEN %s: connection lost: %s", self.channel, exc)
                break
        self.connected.clear()

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        self.connected.clear()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.terminate()
