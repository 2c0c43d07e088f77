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
import math
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from periodic_manager.clock import SystemClock, next_tick, sleep_unless
from periodic_manager.contracts import CarriedBeat, ChangeCallback, Clock, PartitionHandler
from periodic_manager.runtime.clock_offset import ClockOffset
from periodic_manager.runtime.leadership import LEADER_LOCK_NAME, lock_key
from periodic_manager.runtime.liveness_lock import ORPHANS, LivenessLock, holds_own
from periodic_manager.runtime.notify import keep_alive
from periodic_manager.runtime.tasks import cancel_loop, cancelling, reraise_if_cancelled

log = logging.getLogger(__name__)

# The held (partition, epoch) pairs, passed as two arrays.
_HELD = "(partition, epoch) IN (SELECT * FROM unnest($2::int[], $3::bigint[]))"
RENEW = f"""UPDATE pm_partitions SET expires_at = now() + make_interval(secs => $4),
    renewed_at = now() WHERE holder = $1 AND {_HELD} RETURNING partition"""
# Partitions handed over are announced on FREED (payload: the manager that freed them): the other
# managers' lease connections listen, and a round comes at once instead of at their next tick. A
# manager's first round among others announces its join there too (payload: JOINED + its id): a
# holder of more than the new share hands the excess over at once (one first through its round
# before the others registered is reading every row then, and stops reading theirs).
FREED = "pm_partitions_freed"
JOINED = "joined "
ANNOUNCE = "SELECT pg_notify($1, $2)"
# Rounds that notifications on FREED may bring between two rounds on the clock's ticks. Anyone
# who can connect may NOTIFY any channel: a flood of them must not make every manager renew its
# leases in a loop. A fleet's joins and hand-overs need one each; past this budget a
# notification waits for the next round on a tick (said once per interval, at WARNING).
FREED_ROUNDS_PER_INTERVAL = 16
RELEASE = f"""WITH released AS (UPDATE pm_partitions SET holder = NULL, expires_at = NULL
    WHERE holder = $1 AND {_HELD} RETURNING partition)
    SELECT pg_notify('{FREED}', $1) FROM released LIMIT 1"""
# The epoch is untrusted like any column: one written at bigint's maximum starts again at 1 (a
# holder of that partition's old epoch lost it long ago), instead of failing every take. A
# partition never held (epoch 0) gets its first_held_at: $4, the taking manager's clock (the
# clock its first slots are judged by); later takes keep it (null: held before migration 0022).
# Free, expired, or held by a dead manager (its liveness lock is free: runtime.liveness_lock).
_CLAIMABLE = f"holder IS NULL OR expires_at < now() OR holder IN ({ORPHANS})"
TAKE = f"""UPDATE pm_partitions SET holder = $1,
    epoch = CASE WHEN epoch >= 9223372036854775807 THEN 1 ELSE epoch + 1 END,
    expires_at = now() + make_interval(secs => $2), renewed_at = now(),
    first_held_at = COALESCE(first_held_at, CASE WHEN epoch = 0 THEN $4::timestamptz END)
    WHERE partition IN (
        SELECT partition FROM pm_partitions WHERE {_CLAIMABLE}
        ORDER BY partition LIMIT $3 FOR UPDATE SKIP LOCKED)
    AND ({_CLAIMABLE})
    RETURNING partition, epoch, first_held_at"""
LEAVE = "DELETE FROM pm_partition_members WHERE member = $1"
COUNT = "SELECT count(*) FROM pm_partitions"
EXPIRY_MARGIN_S = 0.05  # a round for another holder's expiry comes this long after it


# A round's renewal and counts in one statement (one round trip at rest). It renews ($1 member,
# $2/$3 the held pairs, $4 the TTL), renews this member's row, forgets members dead for $5
# seconds, and reads: the partitions renewed; the live members; (recent, coming): the other
# managers registered less than the TTL ago, and those of them that are not members yet (their
# first round is still to come); whether a session holds the advisory lock of leader mode ($6,
# $7: its bigint key's high and low halves); the seconds until the next expiry of a lease held by
# another manager within the TTL (a dead holder's stops moving: a round comes right after it;
# expires_at is a column like any: one far off, or 'infinity', which no subtraction takes, is
# left out before it is subtracted). Every part sees the snapshot the statement started from:
# this member counts itself once among the live whether its row is there yet or not, and
# is never among the dead forgotten. started_at is the other managers' own clock: a skewed clock
# only makes these counts wrong for a while, never a lease (fair shares are an economy of
# memory; the epochs are the safety). The manager's heartbeat row in pm_managers is read as the
# statement's snapshot saw it, before the heartbeat it may carry.
def _round(beat: bool, member: bool = True) -> str:
    """The round's statement; with ``beat``, the manager's heartbeat too (``db.managers.beat_ctes``,
    its parameters from $8 on), its seventh column is the number of manager rows beaten (0:
    this manager's row is gone) and its eighth the number of other managers due for reaping
    (the heartbeat's loop removes them, never this round: its bound is the leases'). Without
    ``member`` (a manager standing down, :mod:`~periodic_manager.runtime.target_health`) its
    member row expires at once: the others count it neither live nor coming."""
    expiry = "now() + make_interval(secs => $4)" if member else "now()"
    beat_ctes = ""
    beaten = ""
    if beat:
        from periodic_manager.db.managers import beat_ctes as ctes

        beat_ctes = f"{ctes(8)},"
        beaten = ", (SELECT count(*) FROM beat), (SELECT * FROM due)"
    return f"""WITH renewed AS ({RENEW}), {beat_ctes}
    joined AS (INSERT INTO pm_partition_members (member, expires_at, liveness_lock)
        VALUES ($1, {expiry}, {holds_own("$1::text")})
        ON CONFLICT (member) DO UPDATE SET expires_at = EXCLUDED.expires_at,
        liveness_lock = EXCLUDED.liveness_lock),
    forgot AS (DELETE FROM pm_partition_members
        WHERE expires_at < now() - make_interval(secs => $5) AND member <> $1)
    SELECT ARRAY(SELECT partition FROM renewed),
    1 + (SELECT count(*) FROM pm_partition_members WHERE expires_at > now() AND member <> $1
        AND member NOT IN ({ORPHANS})),
    c.recent, c.coming,
    EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
        AND objsubid = 1 AND classid::bigint = $6 AND objid::bigint = $7
        AND database = (SELECT oid FROM pg_database WHERE datname = current_database())),
    (SELECT extract(epoch FROM min(expires_at) - now())::float8 FROM pm_partitions
        WHERE holder <> $1 AND expires_at > now()
        AND expires_at <= now() + make_interval(secs => $4)){beaten}, now()
    FROM (SELECT count(*) AS recent, count(*) FILTER (WHERE NOT EXISTS (
        SELECT 1 FROM pm_partition_members p WHERE p.member = m.manager_id))
        AS coming
        FROM pm_managers m WHERE m.manager_id <> $1
        AND m.started_at > now() - make_interval(secs => $4)) c"""


ROUND = _round(beat=False)
# The same round carrying the manager's heartbeat (PartitionLeases.carry): in partitions mode a
# manager at rest makes one round trip per round, and none for its heartbeat.
ROUND_BEAT = _round(beat=True)
# A manager standing down (its targets do not answer): (with the heartbeat?) -> its round.
ROUNDS_STOOD_DOWN = {beat: _round(beat=beat, member=False) for beat in (False, True)}


def fair_share(partitions: int, live: int) -> int:
    """How many partitions one of ``live`` managers may hold: at most one above the even share."""
    return math.ceil(partitions / max(1, live))


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


class PartitionLeases:
    """A :class:`~periodic_manager.contracts.PartitionLeadership` on PostgreSQL (see the module
    doc). ``member``: this manager's id (the holder written in the leases); ``ttl``: seconds a
    lease runs unrenewed; ``margin``: seconds before the trusted end of a lease at which this
    manager stops sending for it (default ``ttl / 5``)."""

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
        self.dsn = dsn.replace("postgresql+asyncpg://", "postgresql://")
        self.member = member
        self.clock: Clock = clock or SystemClock()
        self.ttl = ttl
        self.margin = margin
        self.interval = ttl / 3
        self.handovers = 0  # partitions handed over cleanly (stop included)
        self._count = 0
        # partition -> (epoch, trusted until: on the clock's monotonic time)
        self._held: dict[int, tuple[int, float]] = {}
        self._handler: PartitionHandler = _Quiet()
        self._on_change: ChangeCallback | None = None
        self._leading = False
        self._conn: Any = None
        self._task: asyncio.Task[None] | None = None
        self._round = asyncio.Lock()
        self._last_error: str | None = None
        self._first = True  # no round has counted the managers yet
        self._leader_seen = False  # a leader-mode manager held the leader lock at the last round
        self._beat: CarriedBeat | None = None  # the manager's heartbeat, written by every round
        self._next_expiry: float | None = None  # another holder's next lease expiry (monotonic)
        self._freed = asyncio.Event()  # another manager handed partitions over or joined (FREED)
        self._listen_failed = False  # LISTEN refused (e.g. CockroachDB): rounds on ticks alone
        # This manager's liveness lock on the lease connection, and the watch of the others'.
        self._liveness = LivenessLock(member, ttl=ttl, clock=self.clock)
        self._may_hold: Callable[[], bool] | None = None  # False: stand down (target_health)
        self._stood_down = False  # the last round stood down: the next one that may hold joins
        # This wall clock against the database's, measured by every round (its statement's last
        # column is now()): beyond its limit nothing is taken and everything held handed over.
        self.offset: ClockOffset | None = None

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
                    await asyncio.wait_for(self._conn.execute(LEAVE, self.member), self.interval)
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
                        FREED,
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
                msg = f"{type(exc).__name__}: {exc}"
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

    async def _exchange(self, started: float) -> dict[int, tuple[int, float]]:
        """Renew, count the members, take what is missing to the share; what is above it (to be
        handed over, outside this round's budget)."""
        conn = await self._connect()
        await self._liveness.ensure(conn, holding=bool(self._held), freed=FREED)
        trust = started + self.ttl - self.margin
        asked = dict(self._held)
        parts, epochs = self._pairs(asked)
        key = lock_key(LEADER_LOCK_NAME) & 0xFFFFFFFFFFFFFFFF
        args = (self.member, parts, epochs, self.ttl, self.ttl * 10, key >> 32, key & 0xFFFFFFFF)
        beat = self._beat.values() if self._beat is not None else None
        stand_down = self._may_hold is not None and not self._may_hold()
        before = self.offset.begin() if self.offset is not None else None
        try:
            if stand_down:
                row = await conn.fetchrow(ROUNDS_STOOD_DOWN[beat is not None], *args, *(beat or ()))
            elif beat is None:
                row = await conn.fetchrow(ROUND, *args)
            else:
                row = await conn.fetchrow(ROUND_BEAT, *args, *beat)
        except BaseException:
            if beat is not None and self._beat is not None:
                self._beat.missed()
            raise
        if beat is not None and self._beat is not None:
            self._beat.written(bool(row[6]), int(row[7]))
        if self.offset is not None and before is not None:
            self.offset.observe(before, row[-1])
        renewed, live, recent, coming, leader_locked = (
            set(row[0]),
            int(row[1]),
            row[2],
            row[3],
            row[4],
        )
        # Measured from after the answer, so the database's expiry has passed when the round
        # comes (the statement reads only expiries within the TTL: checked here once more).
        until = row[5]
        self._next_expiry = (
            self.clock.monotonic() + float(until) + EXPIRY_MARGIN_S
            if isinstance(until, float) and 0 <= until <= self.ttl
            else None
        )
        if asked:
            # A partition whose trust ended while the renewal was in flight (the send path
            # dropped it, :meth:`expire`) stays dropped: its lease is left to expire.
            lost = frozenset(p for p in asked if p in self._held and p not in renewed)
            for p in renewed:
                if self._held.get(p) == asked[p]:
                    self._held[p] = (asked[p][0], trust)
            if lost:
                log.warning("partition leases: lost %s (taken by another manager)", _show(lost))
                self._drop(lost)
        if self.offset is not None and not self.offset.agrees:
            # A wall clock off: hand everything over, take nothing, and count as no member
            # (the others' shares would leave this one's share held by nobody).
            await conn.execute(LEAVE, self.member)
            return dict(self._held)
        first, self._first = self._first, False
        joining, self._stood_down = first or self._stood_down, stand_down
        if stand_down:
            # Every member counted is a manager whose targets answer: it gets all of it. With
            # none live, moving the work would help nobody: keep it, take nothing.
            return dict(self._held) if live > 1 else {}
        if joining and (recent or live > 1) and not self._listen_failed:
            await conn.execute(ANNOUNCE, FREED, JOINED + self.member)
        if leader_locked:
            if not self._leader_seen:
                log.warning(
                    "partition leases: a manager with PM_COORDINATION=leader leads this database; "
                    "taking no partitions until it stops (every manager must use the same coordination)"
                )
            self._leader_seen = True
            return dict(self._held)
        if self._leader_seen:
            log.info("partition leases: no leader-mode manager any more; taking a share")
        self._leader_seen = False
        if first and recent:
            log.info(
                "partition leases: %d other manager(s) starting; taking a share next round", recent
            )
            return {}
        share = fair_share(self._count, live + coming)
        if len(self._held) > share:
            return {p: self._held[p] for p in sorted(self._held)[share:]}
        if len(self._held) < share:
            now = self.clock.now()
            taken = await conn.fetch(TAKE, self.member, self.ttl, share - len(self._held), now)
            gained = {int(r[0]): (int(r[1]), trust) for r in taken}
            # Untrusted like any column: only an aware instant before this take bounds a look
            # back (a later one, written by hand, would skip the slots up to it: ignored, the
            # look back is the full grace then).
            first_held = {
                int(r[0]): r[2]
                for r in taken
                if isinstance(r[2], datetime) and r[2].tzinfo is not None and r[2] <= now
            }
            if gained:
                self._held.update(gained)
                log.info(
                    "partition leases: took %s (%d held of %d, %d live, %d coming)",
                    _show(gained),
                    len(self._held),
                    self._count,
                    live,
                    coming,
                )
                await self._report()
                fresh = frozenset(p for p, (epoch, _) in gained.items() if epoch == 1)
                since = {p: at for p, at in first_held.items() if p not in fresh}
                await self._handler.gained(frozenset(gained), fresh, since)
        return {}

    async def _hand_over(self, leases: dict[int, tuple[int, float]]) -> None:
        """Stop sending for ``leases`` at once, let the handler flush, then release them. A
        flush that does not end within the trust left is not waited for: those leases are
        left to expire (the next holder waits for the TTL instead)."""
        parts = frozenset(leases)
        for p in parts:
            self._held.pop(p, None)
        await self._report()
        budget = self.ttl - self.margin - self.interval
        try:
            await asyncio.wait_for(self._handler.releasing(parts), budget)
        except Exception as exc:  # noqa: BLE001 - the leases then expire instead
            reraise_if_cancelled(exc)
            log.error(
                "partition leases: handing over %s did not finish (%s: %s); they expire instead",
                _show(parts),
                type(exc).__name__,
                exc,
            )
            return
        # Released only at the epochs held; if a lease meanwhile passed to another manager,
        # nothing changes.
        if self._conn is not None:
            ps, epochs = self._pairs(leases)
            try:
                await asyncio.wait_for(
                    self._conn.execute(RELEASE, self.member, ps, epochs), self.interval
                )
            except Exception as exc:  # noqa: BLE001 - they expire instead
                reraise_if_cancelled(exc)
                log.warning("partition leases: release failed (%s); they expire instead", exc)
                return
        self.handovers += len(parts)
        log.info("partition leases: handed over %s", _show(parts))

    def expire(self) -> None:
        """Drop every partition whose trust has ended (no renewal came in time), now: the
        scheduler calls it right before every send, so a manager whose event loop was held
        past its trust (a CPU-bound pass, a frozen process) sends nothing for them even when
        its send runs before this loop, or a renewal is still in flight."""
        self._expire()

    def _expire(self) -> None:
        """Drop every partition whose trust has ended (no renewal came in time), or all of them
        while this wall clock is off (it jumped, or is beyond the offset's limit)."""
        if self._held and self.offset is not None and not self.offset.agrees:
            log.error(
                "partition leases: this wall clock is off (%s); sending stops", self.offset.check()
            )
            self._drop(frozenset(self._held))
            return
        now = self.clock.monotonic()
        ended = frozenset(p for p, (_, until) in self._held.items() if until <= now)
        if ended:
            log.error(
                "partition leases: %s not renewed in time; sending for them stops", _show(ended)
            )
            self._drop(ended)

    def _drop(self, parts: frozenset[int]) -> None:
        for p in parts:
            self._held.pop(p, None)
        self._handler.lost(parts)

    async def _report(self) -> None:
        """Tell the leadership callback when holding any partition starts or ends."""
        leading = bool(self._held)
        if leading == self._leading or self._on_change is None:
            self._leading = leading
            return
        self._leading = leading
        result = self._on_change(leading)
        if asyncio.iscoroutine(result):
            await result

    async def _connect(self) -> Any:
        from periodic_manager.db.engine import pg_connect

        if self._conn is None:
            # The server bounds a statement as this manager bounds a round: one it gave up on
            # (and whose connection it dropped) holds no lock for longer on the server.
            self._conn = await pg_connect(
                self.dsn,
                timeout=self.interval,
                server_settings={
                    "application_name": "periodic_manager partitions",
                    "statement_timeout": str(max(1, int(self.interval * 1000))),
                },
            )
            # The liveness lock lives as long as this session: its end is watched both ways.
            self._conn.add_termination_listener(self._on_terminated)
            with contextlib.suppress(OSError):
                keep_alive(self._conn)
            await self._liveness.prepare(self._conn)
            self._count = int(await self._conn.fetchval(COUNT))
            if self._count == 0:
                raise RuntimeError("pm_partitions has no rows: run `periodic-manager migrate`")
            try:
                await self._conn.add_listener(FREED, self._on_freed)
            except Exception as exc:  # noqa: BLE001 - a server without LISTEN: rounds on ticks
                if not self._listen_failed:
                    log.info(
                        "partition leases: no LISTEN (%s); freed partitions are taken at the next round",
                        exc,
                    )
                self._listen_failed = True
        return self._conn

    def _on_freed(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        joined = payload.startswith(JOINED)
        if (payload[len(JOINED) :] if joined else payload) == self.member:
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
                _show(self._held),
            )
            self._drop(frozenset(self._held))

    @staticmethod
    def _pairs(leases: dict[int, tuple[int, float]]) -> tuple[list[int], list[int]]:
        parts = sorted(leases)
        return parts, [leases[p][0] for p in parts]


def _show(parts: object) -> str:
    items = sorted(parts)  # type: ignore[call-overload]
    return f"{len(items)} partition(s) {items[:8]}{'...' if len(items) > 8 else ''}"
