"""A manager in the runtime store: registered at start, a heartbeat every interval (at once when
its leadership changes), everything published again after the store failed, dead managers reaped;
and, in a loop of its own, the target's brokers watched for data they lost.

The API reads the store, so ``/managers`` and ``/entries`` show managers in any process; one that
misses three heartbeats disappears from them (and is reaped by the next live one).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from datetime import datetime, timedelta

from periodic_manager import __version__
from periodic_manager.clock import next_tick, sleep_unless
from periodic_manager.contracts import (
    Clock,
    EntryRecord,
    Forgetful,
    ManagerInfo,
    ManagerStatus,
    RuntimeStore,
)
from periodic_manager.runtime.metrics import ManagerMetrics
from periodic_manager.runtime.tasks import reraise_if_cancelled

log = logging.getLogger(__name__)


class Heartbeat:
    """Publishes the manager and its ``status()`` every ``interval`` seconds, and after a store
    failure everything again (``records()``: every entry and row error this manager holds)."""

    def __init__(
        self,
        store: RuntimeStore,
        manager_id: str,
        *,
        status: Callable[[], ManagerStatus],
        records: Callable[[], list[EntryRecord]],
        clock: Clock,
        interval: float,
        metrics: ManagerMetrics,
    ) -> None:
        self.store = store
        self.manager_id = manager_id
        self.info: ManagerInfo | None = None  # set by register()
        self._status = status
        self._records = records
        self.clock = clock
        self.interval = interval
        self.metrics = metrics
        self.registered = False
        self.now = asyncio.Event()  # beat at once (leadership changed)
        self.lock = asyncio.Lock()  # held during a beat

    async def register(self, started_at: datetime) -> None:
        """Publish this manager, started at ``started_at`` (a failure is retried by the
        heartbeat)."""
        self.info = ManagerInfo(
            self.manager_id, socket.gethostname(), os.getpid(), __version__, started_at
        )
        try:
            await self.store.register_manager(self.info, self._status())
            self.registered = True
        except Exception as exc:
            reraise_if_cancelled(exc)
            log.warning("could not publish manager %s (will retry): %s", self.manager_id, exc)

    def store_failed(self, exc: BaseException) -> None:
        """A write to the store failed: publish this manager and its entries again next beat."""
        self.registered = False

    async def run(self) -> None:
        while True:
            await sleep_unless(self.clock, self.now, until=next_tick(self.clock.now(), self.interval))
            self.now.clear()
            async with self.lock:
                await self.beat()

    async def beat(self) -> None:
        assert self.info is not None, "register() first"
        try:
            if not self.registered:
                # The store was unreachable: publish this manager and all its entries again.
                await self.store.register_manager(self.info, self._status())
                await self.store.apply_entries(self.manager_id, self._records(), [])
                self.registered = True
            status = self._status()
            # Reap relative to the instant written, so this manager never reaps itself.
            reap_before = status.heartbeat_at - timedelta(seconds=3 * self.interval)
            await self.store.heartbeat(self.manager_id, status, reap_before=reap_before)
        except Exception as exc:
            reraise_if_cancelled(exc)
            if self.registered:
                log.warning("heartbeat failed (will retry): %r", exc)
            self.registered = False

    async def watch(self, target: Forgetful) -> None:
        """Every interval, in a loop of its own (a broker slow to answer never delays the
        heartbeat): say once, loudly, when a broker of ``target`` lost its data (a Redis
        restarted without persistence): its claims of recent slots are gone (see
        ``targets.redis.sentinel``)."""
        # The first look a whole interval after the start, as ever (a manager stopped sooner
        # writes nothing to the broker); then on the ticks of the heartbeat.
        await self.clock.sleep(self.interval)
        while True:
            try:
                lost = await target.forgotten()
            except Exception as exc:
                reraise_if_cancelled(exc)
                lost = []  # the broker is down: the sends and /readyz say so
            for name in lost:
                self.metrics.broker_data_lost(name)
                log.error(
                    "the %s target's broker lost its data (restarted without persistence, "
                    "flushed or failed over to an empty replica): its claims of recent slots are "
                    "gone. A takeover still sends no slot the database records as settled; a slot "
                    "in flight may be sent twice.", name,
                )  # fmt: skip
            await self.clock.sleep_until(next_tick(self.clock.now(), self.interval))
