"""Partition leases on PostgreSQL: every manager holds a fair share of the partitions.

``pm_partitions`` has one row per partition: its ``holder``, a fencing ``epoch`` bumped by every
take, and ``expires_at`` (database time). ``pm_partition_members`` has one row per manager taking
part, alive until its ``expires_at``. :class:`PartitionLeases` runs one round every ``ttl / 3``
(on the clock's ticks, :func:`~periodic_manager.clock.next_tick`: the process's other periodic
looks wake with a round) on an asyncpg connection of its own:

1. **renew** every held partition in one conditional UPDATE (holder = me and the epoch I took it
   at): a partition not returned is lost at once. A lease is trusted only until the local clock
   at the *start* of the renewal that returned it + ``ttl - margin``: the database's expiry is at
   least ``ttl`` after that instant, so this manager stops sending for a partition (and drops
   it) before any other manager may take it, even if every renewal fails from then on. The
   local clock here is the monotonic one (``Clock.monotonic``): a step of the wall clock (back
   120 s, forward 60 s) neither lengthens nor shortens the trust, and the wait for another
   holder's expiry is measured on it too;
2. **membership**: this manager's member row is renewed in the same round; the fair share is
   ``ceil(partitions / managers)``, so no manager holds more than one above the even share. The
   managers counted are the live members and the *coming* ones: managers registered in
   ``pm_managers`` less than ``ttl`` ago that are not members yet (between their registration
   and their first round). At its first round a manager that finds another one registered less
   than ``ttl`` ago (managers starting together, or joining together) takes nothing and waits
   one round (``ttl / 3``, to the instant; its rounds come on ticks after that) for the others
   to register; then each takes only its share, instead of the first one through a round
   taking, reading and registering every partition and then handing most of them over. A
   manager alone (no other registered lately) takes every partition at its first round,
   without waiting. A manager that registered and died before its first round holds the others
   back for at most ``ttl`` after it registered. A first round among other managers announces
   the join (NOTIFY ``pm_partitions_freed``, payload ``joined <id>``): a holder of more than the
   new share runs a round at once (managers holding nothing ignore it: they are waiting for the
   ones still starting). One manager through its first round before any other registered has
   taken every partition and is reading every row; it hands the excess over within a round
   trip of the others' joins, and its read keeps no more of those partitions' rows;
3. **hand over** what is above the share: those partitions stop at once, the handler's
   ``releasing`` waits for a send under way and flushes what was sent, then one conditional
   UPDATE clears the holder (only at the epoch held: a stale holder changes nothing) and
   NOTIFYs ``pm_partitions_freed``: the other managers' lease connections listen, and a round
   comes at once, so a joiner's share or a leaver's partitions are taken within a round trip,
   not at the next tick (without LISTEN, e.g. CockroachDB, at the next tick); anyone may NOTIFY
   that channel, so notifications bring ``FREED_ROUNDS_PER_INTERVAL`` rounds at most between two
   rounds on ticks;
4. **take** what is missing to the share from free or expired partitions, in one conditional
   UPDATE that bumps their epochs. A partition taken for the first time (epoch 0) records
   ``first_held_at``: this manager's clock at the take, the clock its first slots are judged
   by. The handler's ``gained`` learns which partitions are taken for the first time
   (``fresh``: they start as at a first start, with no look back) and, for the others, when
   they were first held: a takeover looks back up to the grace window but never before that
   instant, since slots due before any manager held a partition are owed by nobody (at a
   cluster's first start the first manager takes every partition and hands most of them over a
   round later, before any of their slots came due). A partition held before that instant was
   recorded (migration 0022) looks back the full grace.

Every manager of a database must use the same coordination. A manager of this kind that finds
the leader lock of ``PM_COORDINATION=leader`` held (a manager of the other kind leads, e.g. an
older one during a rolling upgrade to the ``auto`` default) hands over what it holds and takes
nothing until that lock is free, so the two kinds never send side by side for long (the targets'
claims drop the duplicates of the one round in between).

A manager that died (SIGKILL, the OOM killer) is taken over within about a second, not at its
leases' expiry: :mod:`periodic_manager.runtime.liveness_lock` (each manager holds an advisory
lock of its session on the lease connection; a member whose lock is free is counted out of the
share and its leases are claimable in TAKE; a watch asks for them every 0.5 s; a manager whose
lease connection ends stops sending for every partition at once).

A manager whose targets do not answer stands down (:meth:`PartitionLeases.gate`,
:mod:`~periodic_manager.runtime.target_health`): its member row expires at once, it takes nothing
and hands over what it holds, as above, while any member is live.

On :meth:`stop` (SIGTERM) every partition is handed over at once and the member row deleted. A
manager alone holds every partition. Times in SQL are the database's (``now()``), so managers'
clocks need not agree; the local monotonic clock measures only the trust window, and ``first_held_at``
(an instant of the slots' timeline, not of the leases': compared with slots, never with
``now()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from periodic_manager.clock import next_tick, sleep_unless
from periodic_manager.contracts import CarriedBeat, ChangeCallback, Clock, PartitionHandler
from periodic_manager.db import leases
from periodic_manager.errors import cause
from periodic_manager.runtime.lease_round import Held, LeaseRound, show
from periodic_manager.runtime.liveness_lock import LivenessLock
from periodic_manager.runtime.tasks import cancel_loop, cancelling, reraise_if_cancelled

log = logging.getLogger(__name__)

# Rounds that notifications on FREED may bring between two rounds on the clock's ticks. Anyone
# who can connect may NOTIFY any channel: a flood of them must not make every manager renew its
# leases in a loop. A fleet's joins and hand-overs need one each; past this budget a
# notification waits for the next round on a tick (said once per interval, at WARNING).
FREED_ROUNDS_PER_INTERVAL = 16


class _Quiet:
    """A handler that does nothing (the leases alone, as in their tests)."""

    async def gained(
        self, partitions: frozenset[int], fresh: frozenset[int], first_held: Mapping[int, datetime]
    ) -> None:
        return None

    async def releasing(self, partitions: frozenset[int]) -> None:
        return None

    def lost(self, partitions: frozenset[int]) -> None:
        return None


class PartitionLeases(LeaseRound):
    """A :class:`~periodic_manager.contracts.PartitionLeadership` on PostgreSQL (see the module
    doc; a round is :class:`~periodic_manager.runtime.lease_round.LeaseRound`, its statements
    :mod:`periodic_manager.db.leases`). ``member``: this manager's id (the holder written in the
    leases); ``ttl``: seconds a lease runs unrenewed; ``margin``: seconds before the trusted end
    of a lease at which this manager stops sending for it (default ``ttl / 5``)."""

    def __init__(
        self,
        dsn: str,
        member: str,
        *,
        ttl: float,
        clock: Clock | None = None,
        margin: float | None = None,
    ) -> None:
        margin = ttl / 5 if margin is None else margin
        if not 0 < margin < ttl:
            raise ValueError("the lease margin must be positive and shorter than the lease TTL")
        super().__init__(member, ttl=ttl, margin=margin, clock=clock)
        self.dsn = dsn
        self._handler = _Quiet()
        self._task: asyncio.Task[None] | None = None
        self._round = asyncio.Lock()
        self._last_error: str | None = None
        self._freed = asyncio.Event()  # another manager handed partitions over or joined (FREED)
        # This manager's liveness lock on the lease connection, and the watch of the others'.
        self._liveness = LivenessLock(member, ttl=ttl, clock=self.clock)
        self._may_hold: Callable[[], bool] | None = None  # False: stand down (target_health)

    # -- the contract --------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        now = self.clock.monotonic()
        return any(now < until for _, until in self._held.values())

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    @property
    def count(self) -> int:
        return self._count

    @property
    def held(self) -> frozenset[int]:
        now = self.clock.monotonic()
        return frozenset(p for p, (_, until) in self._held.items() if now < until)

    def trusted(self, partition: int) -> bool:
        held = self._held.get(partition)
        return held is not None and self.clock.monotonic() < held[1]

    def attach(self, handler: PartitionHandler) -> None:
        self._handler = handler

    def gate(self, may_hold: Callable[[], bool]) -> None:
        """Consult ``may_hold`` at every round: False (the targets do not answer) stands down:
        this manager's member row expires, it takes nothing and hands over what it holds while
        a member is live (:mod:`~periodic_manager.runtime.target_health`)."""
        self._may_hold = may_hold

    def wake(self) -> None:
        """A round now (the answer of the gate changed), as a hand-over announced does."""
        self._freed.set()

    def carry(self, beat: CarriedBeat) -> None:
        """Write the manager's heartbeat ``beat`` in every round's statement (ROUND_BEAT): the
        manager then writes no heartbeat of its own while the rounds do (the rounds come every
        ``ttl / 3``, no less often than its heartbeats must)."""
        self._beat = beat

    async def start(self, on_change: ChangeCallback) -> None:
        """Take part: one round (alone, this takes every partition), then one every ``ttl/3``."""
        self._on_change = on_change
        await self.round()
        self._task = asyncio.ensure_future(self._loops())
        self._task.set_name("periodic-manager-partitions")

    async def _loops(self) -> None:
        """The rounds, and the watch for dead holders (liveness locks): one fails, both end."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._loop(), name="periodic-manager-partition-rounds")
            watch = self._liveness.watch(self._orphaned, self.round)
            group.create_task(watch, name="periodic-manager-liveness-watch")

    async def _orphaned(self) -> list[int] | None:
        """The live leases of dead holders, asked on the lease connection between rounds (None:
        no connection, a round under way, or every partition held here: a manager alone asks
        nothing). A failure is this connection's: dropped, with every partition (the lock may
        be gone with it)."""
        if len(self._held) == self._count:
            return None
        if self._conn is None or self._round.locked():
            if self._conn is None:
                await self._report()  # the connection ended meanwhile (termination callback)
            return None
        async with self._round:
            try:
                async with asyncio.timeout(self.interval):
                    return await self._liveness.orphaned(self._conn)
            except Exception as exc:  # noqa: BLE001 - the next round reconnects
                if cancelling():
                    self._drop_connection()
                reraise_if_cancelled(exc)
                log.warning(
                    "partition leases: liveness watch failed: %s: %s", type(exc).__name__, exc
                )
                self._drop_connection()
            await self._report()
            return None

    async def stop(self) -> None:
        """Hand every partition over at once and leave (the others take them at their next
        round)."""
        await cancel_loop(self._task, self.ttl)
        self._task = None
        async with self._round:
            # Leave first: the round that the hand-over's notification brings the others counts
            # this manager out already, and takes every partition it freed.
            with contextlib.suppress(Exception):
                if self._conn is not None:
                    await asyncio.wait_for(leases.leave(self._conn, self.member), self.interval)
            held = dict(self._held)
            if held:
                await self._hand_over(held)
            await self._report()
            self._drop_connection()

    # -- rounds --------------------------------------------------------------------------------

    async def _loop(self) -> None:
        # Rounds on the clock's ticks (next_tick): at rest the process's other periodic loops
        # (the health look every 15 s, the broker and LISTEN looks every minute) wake with a
        # round instead of on their own. A first round that took nothing (it waits for managers
        # starting beside it to register) is followed exactly one interval later: not at a tick
        # that may be a moment away (too soon for them to register), nor at the tick after the
        # interval (up to one more interval with no partition held, at every fleet start).
        # Another holder's lease that expires before the next round brings a round right after
        # it: a dead manager's partitions are taken at its TTL, not up to one round later (a
        # live holder renews before: its expiry moves on and this never comes at rest).
        now = self.clock.now()
        if self._held:
            next_round = next_tick(now, self.interval)
        else:
            next_round = now + timedelta(seconds=self.interval)
        # Partitions handed over by another manager (FREED) bring a round at once too, up to
        # FREED_ROUNDS_PER_INTERVAL of them between two rounds on ticks.
        budget = FREED_ROUNDS_PER_INTERVAL
        while True:
            # Wake for the next round, or earlier when the trust in a lease ends first.
            expiry = self._next_expiry
            ends = [t for _, t in self._held.values()] + ([expiry] if expiry is not None else [])
            until = min([next_round, *map(self._on_wall, ends)])
            freed = await sleep_unless(self.clock, self._freed, until=until)
            self._freed.clear()
            self._expire()
            now = self.clock.now()
            ticked = now >= next_round
            expired = expiry is not None and self.clock.monotonic() >= expiry
            if ticked:
                budget = FREED_ROUNDS_PER_INTERVAL
            elif freed and not expired:
                if budget == 0:
                    continue  # spent: this notification waits for the round on the next tick
                budget -= 1
                if budget == 0:
                    log.warning(
                        "partition leases: %d notifications on %s brought a round each since "
                        "the last round on a tick; more wait for the next one (%.0f s at most)",
                        FREED_ROUNDS_PER_INTERVAL,
                        leases.FREED,
                        (next_round - now).total_seconds(),
                    )
            if freed or ticked or expired:
                await self.round()
                next_round = next_tick(self.clock.now(), self.interval)

    def _on_wall(self, monotonic: float) -> datetime:
        """The wall-clock instant a wait until ``monotonic`` ends at, as the clock reads now
        (the real clock's timers run on monotonic time once armed)."""
        return self.clock.now() + timedelta(seconds=max(0.0, monotonic - self.clock.monotonic()))

    async def quiet(self) -> None:
        """Return once no round is under way (tests drive rounds with a virtual clock)."""
        async with self._round:
            pass

    async def round(self) -> None:
        """One round: renew, count members, hand over or take (public for tests)."""
        async with self._round:
            started = self.clock.monotonic()
            self._next_expiry = None  # a round that fails waits for no expiry (no busy loop)
            excess: dict[int, tuple[int, float]] = {}
            try:
                # Bounded: a round that hangs must not outlive the trust of what is held
                # (asyncio.timeout: 3.11's wait_for may drop the cancellation of a stop).
                async with asyncio.timeout(self.interval):
                    excess = await self._exchange(started)
            except Exception as exc:  # noqa: BLE001 - any failure: nothing renewed this round
                if cancelling():
                    self._drop_connection()
                reraise_if_cancelled(exc)
                msg = cause(exc)
                if msg != self._last_error:
                    log.warning("partition leases: round failed: %s", msg)
                self._last_error = msg
                self._drop_connection()
            else:
                self._last_error = None
            if excess:
                await self._hand_over(excess)  # bounded on its own (a flush takes its time)
            self._expire()
            await self._report()

    async def _exchange(self, started: float) -> Held:
        """A round on the lease connection (:meth:`LeaseRound.exchange`): what is above the
        share, to be handed over."""
        conn = await self._connect()
        await self._liveness.ensure(conn, holding=bool(self._held))
        stand_down = self._may_hold is not None and not self._may_hold()
        return await self.exchange(conn, started, stand_down=stand_down)

    async def _connect(self) -> Any:
        if self._conn is None:
            # The liveness lock lives as long as this session: its end is watched both ways.
            self._conn = await leases.connect(
                self.dsn, bound_s=self.interval, ended=self._on_terminated
            )
            await self._liveness.prepare(self._conn)
            self._count = await leases.count(self._conn)
            if self._count == 0:
                raise RuntimeError("pm_partitions has no rows: run `periodic-manager migrate`")
            try:
                await leases.listen_freed(self._conn, self._on_freed)
            except Exception as exc:  # noqa: BLE001 - a server without LISTEN: rounds on ticks
                if not self._listen_failed:
                    log.info(
                        "partition leases: no LISTEN (%s); freed partitions are taken at the next round",
                        cause(exc),
                    )
                self._listen_failed = True
        return self._conn

    def _on_freed(self, payload: str) -> None:
        joined = payload.startswith(leases.JOINED)
        if (payload[len(leases.JOINED) :] if joined else payload) == self.member:
            return  # a manager's own hand-over or join wakes only the others
        if joined and not self._held:
            return  # a join matters to a holder alone (it may hold more than the new share)
        self._freed.set()

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.terminate()
            self._conn = None
        self._lock_gone()

    def _on_terminated(self, conn: object) -> None:
        if conn is self._conn:  # ended by the server or the network, not dropped here
            log.warning("partition leases: the lease connection ended")
            self._conn = None
            self._lock_gone()

    def _lock_gone(self) -> None:
        """The lease connection ended: if it held the liveness lock, the others may take every
        lease of this manager at once, so sending for all of them stops now."""
        if self._liveness.lost() and self._held:
            log.error(
                "partition leases: the lease connection ended with this manager's liveness lock; "
                "the others may take %s at once: sending for them stops",
                show(self._held),
            )
            self._drop(frozenset(self._held))
