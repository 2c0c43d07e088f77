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
(``KEEPALIVE`` of :mod:`periodic_manager.db.dialects.postgresql`: within about 25 s of
silence), which ends it the same way. A ``SELECT 1`` probe every ``check_interval`` (60 s) remains as the backstop (a socket whose options could not
be set, a server that answers the keepalives but no query); the sync loop's periodic read is the
last one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from periodic_manager.clock import SystemClock, next_tick, sleep_unless
from periodic_manager.contracts import Clock
from periodic_manager.db.dialects import postgresql
from periodic_manager.errors import cause
from periodic_manager.runtime.tasks import SignalLoop, reraise_if_cancelled

log = logging.getLogger(__name__)

CHANNEL = "periodic_jobs"


def partitions_of(payload: str) -> frozenset[int] | None:
    """The partitions a notification's payload names; None (anything may have changed) when it
    is empty or not a list of partition numbers (the payload is data: never trusted)."""
    try:
        parts = frozenset(int(p) for p in payload.split(","))
    except ValueError:
        return None
    return parts if all(0 <= p for p in parts) else None


class PostgresChangeListener(SignalLoop):
    """Calls ``on_change(partitions)`` (given to :meth:`start`) for every notification on
    ``channel``, and ``on_change(None)`` after every reconnect."""

    name = "listener"

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
        super().__init__(timeout)
        self.dsn = dsn
        self.channel = channel
        # Reconnect backoff and health checks use real time even under a virtual scheduler clock:
        # they wait for a server, not for a slot.
        self.clock: Clock = clock or SystemClock()
        self.check_interval = check_interval
        self.max_backoff = max_backoff
        self.connected = asyncio.Event()
        self.reconnects = 0
        self.kept_alive = False  # the connection's socket has TCP keepalives (keep_alive)
        self._conn: Any = None
        self._lost = asyncio.Event()

    async def stop(self) -> None:
        await super().stop()
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
        # An event per connection: asyncpg calls a connection's termination callbacks a loop turn
        # after it ends (the one this listener dropped included), by then this connect is under
        # way, and a shared event would end the next connection too (then each the next).
        lost = self._lost = asyncio.Event()
        conn = await postgresql.session(
            self.dsn,
            connect_s=self.timeout,
            settings={"application_name": "periodic_manager listener"},
            ended=lambda _c: lost.set(),
        )
        try:
            self.kept_alive = postgresql.keep_alive(conn)
        except OSError as exc:  # the probe is the backstop
            log.warning("LISTEN %s: cannot set TCP keepalives: %s", self.channel, cause(exc))
            self.kept_alive = False
        await postgresql.listen(conn, self.channel, self._notified)
        self._conn = conn
        self.connected.set()

    def _notified(self, payload: str) -> None:
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
                    await postgresql.probe(self._conn)
            except Exception as exc:  # noqa: BLE001
                reraise_if_cancelled(exc)
                log.warning("LISTEN %s: connection lost: %s", self.channel, cause(exc))
                break
        self.connected.clear()

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        self.connected.clear()
        if conn is not None:
            with contextlib.suppress(Exception):
                postgresql.terminate(conn)
