"""One round of a manager's partition leases, as a sequence read top to bottom
(:meth:`LeaseRound.exchange`): read the members (and renew what is held), compute the fair share,
hand the excess over, take what is missing (free, expired and orphaned partitions), record what
was taken. :class:`~periodic_manager.runtime.partitions.PartitionLeases` runs it every round and
owns the loop, the connection and the contract; the rules are the module doc there.
"""

from __future__ import annotations

import asyncio
import logging
import math
from datetime import datetime
from typing import Any

from periodic_manager.clock import SystemClock
from periodic_manager.contracts import CarriedBeat, ChangeCallback, Clock, PartitionHandler
from periodic_manager.db import leases
from periodic_manager.errors import cause
from periodic_manager.runtime.clock_offset import ClockOffset
from periodic_manager.runtime.tasks import reraise_if_cancelled

# The leases' one logger, whichever of their modules speaks (operators filter on it).
log = logging.getLogger("periodic_manager.runtime.partitions")

EXPIRY_MARGIN_S = 0.05  # a round for another holder's expiry comes this long after it
# partition -> (epoch, trusted until: on the clock's monotonic time)
Held = dict[int, tuple[int, float]]


def fair_share(partitions: int, live: int) -> int:
    """How many partitions one of ``live`` managers may hold: at most one above the even share."""
    return math.ceil(partitions / max(1, live))


def show(parts: object) -> str:
    """A few partitions of ``parts`` for a log line."""
    items = sorted(parts)  # type: ignore[call-overload]
    return f"{len(items)} partition(s) {items[:8]}{'...' if len(items) > 8 else ''}"


class LeaseRound:
    """The leases held and what one round does with them (the state a round reads and moves);
    :class:`~periodic_manager.runtime.partitions.PartitionLeases` adds the rest."""

    def __init__(self, member: str, *, ttl: float, margin: float, clock: Clock | None) -> None:
        self.member = member
        self.clock: Clock = clock or SystemClock()
        self.ttl = ttl
        self.margin = margin
        self.interval = ttl / 3
        self.handovers = 0  # partitions handed over cleanly (stop included)
        self._count = 0
        self._held: Held = {}
        self._handler: PartitionHandler
        self._on_change: ChangeCallback | None = None
        self._leading = False
        self._conn: Any = None
        self._first = True  # no round has counted the managers yet
        self._leader_seen = False  # a leader-mode manager held the leader lock at the last round
        self._beat: CarriedBeat | None = None  # the manager's heartbeat, written by every round
        self._next_expiry: float | None = None  # another holder's next lease expiry (monotonic)
        self._listen_failed = False  # LISTEN refused (e.g. CockroachDB): rounds on ticks alone
        self._stood_down = False  # the last round stood down: the next one that may hold joins
        # This wall clock against the database's, measured by every round (its statement's last
        # column is now()): beyond its limit nothing is taken and everything held handed over.
        self.offset: ClockOffset | None = None

    # -- the round, top to bottom ----------------------------------------------------------------

    async def exchange(self, conn: Any, started: float, *, stand_down: bool) -> Held:
        """Renew, count the members, take what is missing to the share; what is above it (to be
        handed over, outside this round's budget)."""
        trust = started + self.ttl - self.margin
        counted = await self._read_members(conn, stand_down=stand_down, trust=trust)
        held_back = await self._held_back(conn, counted, stand_down=stand_down)
        if held_back is not None:
            return held_back
        share = fair_share(self._count, counted.live + counted.coming)
        if len(self._held) > share:
            return self._excess(share)
        if len(self._held) < share:
            await self._take(conn, share - len(self._held), trust, counted)
        return {}

    async def _read_members(self, conn: Any, *, stand_down: bool, trust: float) -> leases.Round:
        """The round's statement: renew what is held (a lease not renewed is lost at once; one
        renewed is trusted until ``trust``), carry the heartbeat, count the members."""
        asked = dict(self._held)
        beat = self._beat.values() if self._beat is not None else None
        before = self.offset.begin() if self.offset is not None else None
        held = [(p, asked[p][0]) for p in sorted(asked)]
        try:
            counted = await leases.round_trip(
                conn, self.member, held, self.ttl, beat=beat, stand_down=stand_down
            )
        except BaseException:
            if beat is not None and self._beat is not None:
                self._beat.missed()
            raise
        if beat is not None and self._beat is not None:
            self._beat.written(counted.beaten, counted.due)
        if self.offset is not None and before is not None:
            self.offset.observe(before, counted.now)
        # Measured from after the answer, so the database's expiry has passed when the round
        # comes (the statement reads only expiries within the TTL: checked here once more).
        until = counted.until
        self._next_expiry = (
            self.clock.monotonic() + float(until) + EXPIRY_MARGIN_S
            if isinstance(until, float) and 0 <= until <= self.ttl
            else None
        )
        if asked:
            self._renewed(asked, counted.renewed, trust)
        return counted

    def _renewed(self, asked: Held, renewed: frozenset[int], trust: float) -> None:
        # A partition whose trust ended while the renewal was in flight (the send path
        # dropped it, :meth:`expire`) stays dropped: its lease is left to expire.
        lost = frozenset(p for p in asked if p in self._held and p not in renewed)
        for p in renewed:
            if self._held.get(p) == asked[p]:
                self._held[p] = (asked[p][0], trust)
        if lost:
            log.warning("partition leases: lost %s (taken by another manager)", show(lost))
            self._drop(lost)

    async def _held_back(
        self, conn: Any, counted: leases.Round, *, stand_down: bool
    ) -> Held | None:
        """What this round hands over when it may take no share (None: it may): a wall clock
        off, a manager standing down, a leader-mode manager leading, a first round among
        managers starting together. A first round among others announces the join."""
        if self.offset is not None and not self.offset.agrees:
            # A wall clock off: hand everything over, take nothing, and count as no member
            # (the others' shares would leave this one's share held by nobody).
            await leases.leave(conn, self.member)
            return dict(self._held)
        first, self._first = self._first, False
        joining, self._stood_down = first or self._stood_down, stand_down
        if stand_down:
            # Every member counted is a manager whose targets answer: it gets all of it. With
            # none live, moving the work would help nobody: keep it, take nothing.
            return dict(self._held) if counted.live > 1 else {}
        if joining and (counted.recent or counted.live > 1) and not self._listen_failed:
            await leases.announce_join(conn, self.member)
        if counted.leader_locked:
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
        if first and counted.recent:
            log.info(
                "partition leases: %d other manager(s) starting; taking a share next round",
                counted.recent,
            )
            return {}
        return None

    def _excess(self, share: int) -> Held:
        """The leases above ``share`` (the highest partitions), to be handed over."""
        return {p: self._held[p] for p in sorted(self._held)[share:]}

    async def _take(self, conn: Any, wanted: int, trust: float, counted: leases.Round) -> None:
        """Take up to ``wanted`` free, expired or orphaned partitions and record them: trusted
        until ``trust``; the handler learns which are fresh (never held before) and, for the
        others, when they were first held."""
        now = self.clock.now()
        taken = await leases.take(conn, self.member, self.ttl, wanted, now)
        gained = {p: (epoch, trust) for p, epoch, _ in taken}
        if not gained:
            return
        # Untrusted like any column: only an aware instant before this take bounds a look
        # back (a later one, written by hand, would skip the slots up to it: ignored, the
        # look back is the full grace then).
        first_held = {
            p: at
            for p, _, at in taken
            if isinstance(at, datetime) and at.tzinfo is not None and at <= now
        }
        self._held.update(gained)
        log.info(
            "partition leases: took %s (%d held of %d, %d live, %d coming)",
            show(gained),
            len(self._held),
            self._count,
            counted.live,
            counted.coming,
        )
        await self._report()
        fresh = frozenset(p for p, (epoch, _) in gained.items() if epoch == 1)
        since = {p: at for p, at in first_held.items() if p not in fresh}
        await self._handler.gained(frozenset(gained), fresh, since)

    # -- what a round leaves to do, and what it drops --------------------------------------------

    async def _hand_over(self, held: Held) -> None:
        """Stop sending for ``held`` at once, let the handler flush, then release them. A
        flush that does not end within the trust left is not waited for: those leases are
        left to expire (the next holder waits for the TTL instead)."""
        parts = frozenset(held)
        for p in parts:
            self._held.pop(p, None)
        await self._report()
        budget = self.ttl - self.margin - self.interval
        try:
            await asyncio.wait_for(self._handler.releasing(parts), budget)
        except Exception as exc:  # noqa: BLE001 - the leases then expire instead
            reraise_if_cancelled(exc)
            log.error(
                "partition leases: handing over %s did not finish (%s); they expire instead",
                show(parts),
                cause(exc),
            )
            return
        # Released only at the epochs held; if a lease meanwhile passed to another manager,
        # nothing changes.
        if self._conn is not None:
            pairs = [(p, held[p][0]) for p in sorted(held)]
            try:
                await asyncio.wait_for(
                    leases.release(self._conn, self.member, pairs), self.interval
                )
            except Exception as exc:  # noqa: BLE001 - they expire instead
                reraise_if_cancelled(exc)
                log.warning(
                    "partition leases: release failed (%s); they expire instead", cause(exc)
                )
                return
        self.handovers += len(parts)
        log.info("partition leases: handed over %s", show(parts))

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
                "partition leases: %s not renewed in time; sending for them stops", show(ended)
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
