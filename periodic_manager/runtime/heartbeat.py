"""A manager in the runtime store: registered at start, a heartbeat every interval (at once when
its leadership changes), everything published again after the store failed, dead managers reaped;
and, in a loop of its own, the target's brokers watched for data they lost.

With partition leases on PostgreSQL (the default), the heartbeat is carried by the lease rounds
(:meth:`Heartbeat.carried_by`): every round's one statement writes this manager's row too, and
the heartbeat's own loop writes only what a round cannot (registering again, a beat at once when
the leadership changed or a round failed) and runs the store's prune when it is due. A beat only
counts the managers silent for three heartbeats; this loop removes them after it (their entries
in short transactions), so neither a heartbeat nor a round ever waits on a dead manager's rows.

The API reads the store, so ``/managers`` and ``/entries`` show managers in any process; one that
misses three heartbeats disappears from them (and is reaped by the next live one).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from periodic_manager.clock import next_tick, sleep_unless
from periodic_manager.contracts import (
    BeatCarrier,
    BeatStore,
    Clock,
    EntryRecord,
    Forgetful,
    ManagerInfo,
    ManagerStatus,
    RuntimeStore,
)
from periodic_manager.errors import cause
from periodic_manager.runtime.metrics import ManagerMetrics
from periodic_manager.runtime.tasks import cancel_loop, reraise_if_cancelled
from periodic_manager.version import __version__

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
        # The store as a BeatStore (a database store's: the values a round writes, the history
        # prune after a beat; the memory store has neither).
        self._beat_store: BeatStore | None = store if isinstance(store, BeatStore) else None
        self._by_rounds = False  # set by carried_by(): the rounds write the beats
        self._carried: ManagerStatus | None = None  # the status a round is writing
        self._prune: ManagerStatus | None = None  # a beat after which a prune is due
        self._pruning: asyncio.Task[None] | None = None  # the prune under way
        self._reap: datetime | None = None  # dead managers to remove: heartbeat older than this
        self._woken = asyncio.Event()  # carried: a prune or a reap is due
        # After every beat of this loop's own: the clock's offset from the database's measured
        # (runtime.clock_offset; the lease rounds measure it where they carry the beats).
        self.measure: Callable[[], Awaitable[object]] | None = None

    def carried_by(self, carrier: BeatCarrier) -> None:
        """Let ``carrier``'s statements (lease rounds, on the database of this heartbeat's store,
        a BeatStore) write the beats from now on: this loop then writes one only when a round
        cannot."""
        assert self._beat_store is not None, "a carried heartbeat needs a BeatStore"
        self._by_rounds = True
        carrier.carry(self)

    # -- a beat carried by a round (contracts.CarriedBeat) -------------------------------------

    def values(self) -> tuple[object, ...] | None:
        store = self._beat_store if self._by_rounds else None
        if store is None or not self.registered or self.lock.locked():
            return None  # this loop (re)registers, or beats on its own right now
        status = self._carried = self._status()
        return store.beat_values(self.manager_id, status, self._reap_before(status))

    def written(self, beaten: bool, dead: int) -> None:
        status, self._carried = self._carried, None
        if not beaten:
            log.warning("manager %s was reaped: registering again", self.manager_id)
            self.registered = False
            self.now.set()
            return
        if status is not None and dead:
            self._reap = self._reap_before(status)
            self._woken.set()
        if status is not None and self._prune_due(status):
            self._woken.set()

    def missed(self) -> None:
        self._carried = None
        self.now.set()  # the round failed: beat on its own (and republish if that fails too)

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
            log.warning(
                "could not publish manager %s (will retry): %s", self.manager_id, cause(exc)
            )

    def store_failed(self, exc: BaseException) -> None:
        """A write to the store failed: publish this manager and its entries again next beat."""
        self.registered = False
        if self._by_rounds:
            self.now.set()  # no round would: this loop registers again

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            await cancel_loop(self._pruning, self.interval)  # a prune under way ends with it

    async def _run(self) -> None:
        while True:
            if self._by_rounds and self.registered:
                # Carried: wake only when asked (a leadership change, a failed round, a prune).
                await sleep_unless(self.clock, self.now, self._woken)
                if not self.now.is_set():
                    self._woken.clear()
                    await self._reap_dead()
                    self._start_prune()
                    continue
            else:
                await sleep_unless(
                    self.clock, self.now, until=next_tick(self.clock.now(), self.interval)
                )
            self.now.clear()
            async with self.lock:
                await self.beat()
            if self.measure is not None:
                await self.measure()
            await self._reap_dead()
            self._start_prune()

    def _prune_due(self, status: ManagerStatus) -> bool:
        """Note a prune due after the beat of ``status`` (run by :meth:`_start_prune`)."""
        if self._beat_store is None or not self._beat_store.prune_due(status.heartbeat_at):
            return False
        self._prune = status
        return True

    def _start_prune(self) -> None:
        """The history prune due, in a task of its own: neither the rounds carrying the beats nor
        this loop's own beats wait for it (after a burst of 100,000 a prune took longer than
        three heartbeats under load, and the other managers reaped this one, alive). One at a
        time: one due meanwhile runs after it (the store's timer keeps them apart anyway)."""
        if self._prune is None or (self._pruning is not None and not self._pruning.done()):
            return
        status, self._prune = self._prune, None
        self._pruning = asyncio.ensure_future(self._prune_after(status))
        self._pruning.set_name("periodic-manager-history-prune")

    async def _prune_after(self, status: ManagerStatus) -> None:
        assert self._beat_store is not None
        try:
            await self._beat_store.beaten(status)
        except Exception as exc:  # the store logs its own prune failures; never fail the loop
            reraise_if_cancelled(exc)
            log.warning("history prune after a heartbeat failed: %s", cause(exc))

    async def _reap_dead(self) -> None:
        """Remove the managers a heartbeat found dead, apart from any heartbeat (their entries
        may be many); a failure is logged, and the next heartbeat finds them again."""
        older_than, self._reap = self._reap, None
        if older_than is None:
            return
        try:
            removed = await self.store.reap(
                older_than, silence=timedelta(seconds=3 * self.interval)
            )
        except Exception as exc:
            reraise_if_cancelled(exc)
            log.warning("removing dead managers failed (will retry): %s", cause(exc))
            return
        if removed:
            log.info("removed %d dead manager(s) and their published entries", removed)

    def _reap_before(self, status: ManagerStatus) -> datetime:
        # Reap relative to the instant written, so this manager never reaps itself.
        return status.heartbeat_at - timedelta(seconds=3 * self.interval)

    async def beat(self) -> None:
        assert self.info is not None, "register() first"
        try:
            if not self.registered:
                # The store was unreachable: publish this manager and all its entries again.
                await self.store.register_manager(self.info, self._status())
                await self.store.apply_entries(self.manager_id, self._records(), [])
                self.registered = True
            status = self._status()
            before = self._reap_before(status)
            if await self.store.heartbeat(self.manager_id, status, reap_before=before):
                self._reap = before
            self._prune_due(status)
        except Exception as exc:
            reraise_if_cancelled(exc)
            if self.registered:
                log.warning("heartbeat failed (will retry): %s", cause(exc))
            self.registered = False

    async def watch(self, target: Forgetful, sent: asyncio.Event, *, rest: float = 60.0) -> None:
        """In a loop of its own (a broker slow to answer never delays the heartbeat): say once,
        loudly, when a broker of ``target`` lost its data (a Redis restarted without
        persistence): its claims of recent slots are gone (see ``targets.redis.sentinel``).

        It looks at the first of the heartbeat's ticks after something was sent (``sent`` is
        set by every batch of runs), and otherwise at the ticks of ``rest`` seconds: the claims
        matter to sends, and a manager at rest neither wakes nor asks the broker every interval
        for them (what a broker that lost its data cannot hold for the next send is the
        database's record of settled slots, read by every takeover)."""
        # The first look a whole interval after the start, as ever (a manager stopped sooner
        # writes nothing to the broker).
        await self.clock.sleep(self.interval)
        while True:
            sent.clear()
            if await self._look(target):
                if not await sleep_unless(
                    self.clock, sent, until=next_tick(self.clock.now(), rest)
                ):
                    continue  # at rest: the next look a rest later
            # After a send, or a broker that could not be asked: the next tick.
            await self.clock.sleep_until(next_tick(self.clock.now(), self.interval))

    async def _look(self, target: Forgetful) -> bool:
        """Ask ``target`` once; False when it could not be asked."""
        try:
            lost = await target.forgotten()
        except Exception as exc:
            reraise_if_cancelled(exc)
            return False  # the broker is down: the sends and /readyz say so
        for name in lost:
            self.metrics.broker_data_lost(name)
            log.error(
                "the %s target's broker lost its data (restarted without persistence, "
                "flushed or failed over to an empty replica): its claims of recent slots are "
                "gone. A takeover still sends no slot the database records as settled; a slot "
                "in flight may be sent twice.",
                name,
            )
        return True
