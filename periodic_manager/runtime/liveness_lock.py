"""Liveness locks: a killed manager's partitions are taken within a second or two, not at the TTL.

A partition lease (:mod:`periodic_manager.runtime.partitions`) runs ``PM_LEASE_TTL`` unrenewed:
that bound is what makes a hung or cut-off manager safe (it stops sending before the database
lets anyone take its leases). A manager that *died* needs no such wait, and PostgreSQL knows
when one did: a session ends when its process does (SIGKILL and the OOM killer included, the
kernel closes the socket), and every session-level advisory lock it held is freed with it.

So every manager takes, on its lease connection, a session-level advisory lock keyed by its
member id (``hashtextextended(member, SEED)``, computed by the server from the same text the
leases name as holder), and each lease round writes, in ``pm_partition_members.liveness_lock``,
whether that round's own session holds it (read from ``pg_locks`` by the statement, never
assumed). A member that said so and whose lock no session holds is dead (``ORPHANS``): the
round's fair share does not count it, and its leases are free to take at once, judged by the
database in the TAKE statement itself. A member that never said so (a manager of an older
version, or one whose lock a lingering session of its own still held when it reconnected) keeps
the TTL as its only bound. The statements are :mod:`periodic_manager.db.leases`.

The others notice within :data:`POLL_S`: no notification can come from a dead process, so
:meth:`LivenessLock.watch` asks the database every :data:`POLL_S` on the lease connection,
between rounds, which leases of other holders are orphaned (one short statement), and runs a
round at once when it finds some it has not already run one for.

Fencing stays. The lock lives exactly as long as the lease connection's session, so a manager
stops sending for every partition the moment it drops that connection or learns it ended
(a failed round, a failed watch, asyncpg's termination callback, the client's TCP keepalives):
from then on the others may take its leases at once. A session the server ends on its own,
without the client seeing it, is one whose peer went silent; the server's TCP keepalives
(:func:`server_keepalives`) end it no sooner than ``ttl`` after the last packet from the manager,
and the manager's trust in its leases ends ``margin`` before ``ttl`` after its last renewal
started: a manager cut off or frozen but alive has stopped before its lock can be freed, and the
lease TTL stays the bound for it. A lost host is such a silent peer: its partitions are taken at
the TTL, as before.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from periodic_manager.contracts import Clock
from periodic_manager.db import leases
from periodic_manager.errors import cause
from periodic_manager.runtime.tasks import reraise_if_cancelled

log = logging.getLogger(__name__)

POLL_S = 0.5  # how often a manager asks which leases of other holders are orphaned


def server_keepalives(ttl: float) -> dict[str, str]:
    """The lease session's server-side TCP keepalives: a silent client is dropped (its lock
    freed) no sooner than ``ttl`` after the last packet from it (idle ``ttl``, then probes; and
    unacknowledged data for ``ttl``), so never before that manager's trust ended (module doc)."""
    idle = max(1, math.ceil(ttl))
    return {
        "tcp_keepalives_idle": str(idle),
        "tcp_keepalives_interval": "1",
        "tcp_keepalives_count": "3",
        "tcp_user_timeout": str(idle * 1000),
    }


class LivenessLock:
    """One manager's liveness lock on its lease connection, and its watch of the others'."""

    def __init__(self, member: str, *, ttl: float, clock: Clock, poll: float = POLL_S) -> None:
        self.member = member
        self.ttl = ttl
        self.clock = clock
        self.poll = poll
        self.held = False  # the current lease connection holds this member's lock
        self.supported = True  # False once the server refused the lock (the TTL alone then)
        self._seen: tuple[int, ...] = ()  # the orphaned leases the last watch ran a round for

    async def prepare(self, conn: Any) -> None:
        """On a new lease connection: the server's TCP keepalives (settings it lacks are
        skipped; a failure leaves the server's defaults, which end a silent session later)."""
        self.held = False
        settings = server_keepalives(self.ttl)
        try:
            await leases.set_keepalives(conn, settings)
        except Exception as exc:  # noqa: BLE001 - later, never sooner: still safe
            reraise_if_cancelled(exc)
            log.info("partition leases: server TCP keepalives not set (%s)", cause(exc))

    async def ensure(self, conn: Any, *, holding: bool) -> None:
        """Take the lock on ``conn`` if it is not held yet (a round trip only then). Taken by a
        manager ``holding`` nothing: the leases still naming it are released (and announced)."""
        if self.held or not self.supported:
            return
        try:
            self.held = await leases.try_liveness_lock(conn, self.member)
        except Exception as exc:  # noqa: BLE001 - e.g. no advisory locks: the TTL alone
            reraise_if_cancelled(exc)
            self.supported = False
            log.warning(
                "partition leases: no liveness lock (%s); a dead manager's partitions wait for the lease TTL",
                cause(exc),
            )
            return
        if not self.held:
            # A session of this manager's last connection the server has not ended yet: the
            # rounds say so (liveness_lock false) and it is tried again next round.
            log.info(
                "partition leases: liveness lock held elsewhere for now; the lease TTL bounds this manager's leases"
            )
            return
        if not holding:
            await leases.release_stale(conn, self.member)

    def lost(self) -> bool:
        """The lease connection ended: whether it held the lock (then the others may take this
        manager's leases at once, and it must stop sending for every one now)."""
        held, self.held = self.held, False
        return held

    async def orphaned(self, conn: Any) -> list[int]:
        """The live leases of other holders whose liveness lock is free."""
        return await leases.orphaned(conn, self.member)

    async def watch(
        self,
        probe: Callable[[], Awaitable[Sequence[int] | None]],
        takeover: Callable[[], Awaitable[None]],
    ) -> None:
        """Every :attr:`poll` seconds ``probe()`` (the orphaned leases; None when it could not
        ask), and ``takeover()`` (a round) when it found some it has not run one for: a holder
        that died is taken over at once; a set that stays (every share full) is left to the
        rounds on ticks instead of a round every poll."""
        while True:
            await self.clock.sleep(self.poll)
            found = tuple(await probe() or ())
            if not found:
                self._seen = ()
                continue
            if found != self._seen:
                self._seen = found
                log.info(
                    "partition leases: %d lease(s) of a dead manager (its liveness lock is free); taking over",
                    len(found),
                )
                await takeover()
