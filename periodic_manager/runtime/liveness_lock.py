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
assumed). A member that said so and whose lock no session holds is dead (:data:`ORPHANS`): the
round's fair share does not count it, and its leases are free to take at once, judged by the
database in the TAKE statement itself. A member that never said so (a manager of an older
version, or one whose lock a lingering session of its own still held when it reconnected) keeps
the TTL as its only bound.

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
from periodic_manager.runtime.tasks import reraise_if_cancelled

log = logging.getLogger(__name__)

# Any fixed value; the server derives each member's 64-bit key from its id with it.
SEED = 0x706D6C6976  # "pmliv"
POLL_S = 0.5  # how often a manager asks which leases of other holders are orphaned


def key_sql(member: str) -> str:
    """SQL: the liveness lock's bigint key of the member id that ``member`` (SQL) evaluates to."""
    return f"hashtextextended({member}, {SEED})"


def _granted(key: str) -> str:
    # A session-level advisory lock on one bigint shows in pg_locks as classid (high 32 bits),
    # objid (low 32 bits) and objsubid 1, in the database it was taken in.
    return (
        "SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
        " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        f" AND l.classid::bigint = ({key} >> 32) & 4294967295"
        f" AND l.objid::bigint = {key} & 4294967295"
    )


# The members that said they hold their liveness lock and whose lock no session holds: dead.
ORPHANS = (
    "SELECT o.member FROM pm_partition_members o WHERE o.liveness_lock"
    f" AND NOT EXISTS ({_granted(key_sql('o.member'))})"
)


def holds_own(member: str) -> str:
    """SQL: whether the statement's own session holds the liveness lock of ``member`` (SQL)."""
    return f"EXISTS ({_granted(key_sql(member))} AND l.pid = pg_backend_pid())"


ACQUIRE = f"SELECT pg_try_advisory_lock({key_sql('$1::text')})"
# The live leases of other holders that are orphaned (what a round would take at once).
ORPHANED = f"""SELECT ARRAY(SELECT partition FROM pm_partitions WHERE holder <> $1
    AND expires_at > now() AND holder IN ({ORPHANS}) ORDER BY partition)"""
# On a new lease connection whose lock was just taken, by a manager holding nothing: the leases
# still naming it are ones it dropped (its last connection ended); released, and announced on
# the channel $2, so that they are taken at once instead of at their expiry.
RELEASE_STALE = """WITH released AS (UPDATE pm_partitions SET holder = NULL, expires_at = NULL
    WHERE holder = $1 RETURNING partition) SELECT pg_notify($2, $1) FROM released LIMIT 1"""
SET_KEEPALIVES = """SELECT count(set_config(s.name, s.value, false))
    FROM unnest($1::text[], $2::text[]) AS s(name, value) JOIN pg_settings p ON p.name = s.name"""


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
            await conn.fetchval(SET_KEEPALIVES, list(settings), list(settings.values()))
        except Exception as exc:  # noqa: BLE001 - later, never sooner: still safe
            reraise_if_cancelled(exc)
            log.info("partition leases: server TCP keepalives not set (%s)", exc)

    async def ensure(self, conn: Any, *, holding: bool, freed: str) -> None:
        """Take the lock on ``conn`` if it is not held yet (a round trip only then). Taken by a
        manager ``holding`` nothing: the leases still naming it are released (on ``freed``)."""
        if self.held or not self.supported:
            return
        try:
            self.held = bool(await conn.fetchval(ACQUIRE, self.member))
        except Exception as exc:  # noqa: BLE001 - e.g. no advisory locks: the TTL alone
            reraise_if_cancelled(exc)
            self.supported = False
            log.warning(
                "partition leases: no liveness lock (%s); a dead manager's partitions wait for the lease TTL",
                exc,
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
            await conn.execute(RELEASE_STALE, self.member, freed)

    def lost(self) -> bool:
        """The lease connection ended: whether it held the lock (then the others may take this
        manager's leases at once, and it must stop sending for every one now)."""
        held, self.held = self.held, False
        return held

    async def orphaned(self, conn: Any) -> list[int]:
        """The live leases of other holders whose liveness lock is free."""
        return list(await conn.fetchval(ORPHANED, self.member) or [])

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
