"""The partition leases' statements, PostgreSQL's (:attr:`Database.partitions
<periodic_manager.db.dialects.Database.partitions>`): what
:mod:`periodic_manager.runtime.partitions` and :mod:`periodic_manager.runtime.liveness_lock`
send on their lease connection (asyncpg's own, not the engine's pool), and what they read back.

Times in SQL are the database's (``now()``), so managers' clocks need not agree.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from periodic_manager.db import managers
from periodic_manager.db.dialects.base import LEADER_LOCK_NAME, lock_key
from periodic_manager.db.dialects.postgresql import keep_alive, listen, session

# -- liveness locks (runtime.liveness_lock) ----------------------------------------------------

# Any fixed value; the server derives each member's 64-bit key from its id with it.
SEED = 0x706D6C6976  # "pmliv"


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

# -- leases (runtime.partitions) -----------------------------------------------------------------

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
        beat_ctes = f"{managers.beat_ctes(8)},"
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
_LEADER_KEY = lock_key(LEADER_LOCK_NAME) & 0xFFFFFFFFFFFFFFFF


class Round(NamedTuple):
    """What a round's statement read (:data:`ROUND`), as the columns said (data: untrusted)."""

    renewed: frozenset[int]  # the held partitions renewed
    live: int  # the live members, this one included
    recent: int  # other managers registered less than the TTL ago
    coming: int  # ... of them not members yet
    leader_locked: bool  # a manager of PM_COORDINATION=leader holds its lock
    until: Any  # seconds to another holder's next expiry within the TTL (a float), or None
    beaten: bool  # the carried heartbeat wrote this manager's row
    due: int  # other managers due for reaping (carried heartbeat)
    now: Any  # the database's now()


async def connect(dsn: str, *, bound_s: float, ended: Callable[[Any], None]) -> Any:
    """A lease connection, opened within ``bound_s``: statements bounded by it on the server too (one the manager
    gave up on holds no lock for longer), ``ended(conn)`` when the server or the network ends
    it, and TCP keepalives where its socket takes them."""
    conn = await session(
        dsn,
        connect_s=bound_s,
        settings={
            "application_name": "periodic_manager partitions",
            "statement_timeout": str(max(1, int(bound_s * 1000))),
        },
        ended=ended,
    )
    with contextlib.suppress(OSError):
        keep_alive(conn)
    return conn


async def listen_freed(conn: Any, on_freed: Callable[[str], None]) -> None:
    """``on_freed(payload)`` for each notification on :data:`FREED` (raises without LISTEN)."""
    await listen(conn, FREED, on_freed)


async def count(conn: Any) -> int:
    """How many partitions the database has."""
    return int(await conn.fetchval(COUNT))


async def round_trip(
    conn: Any,
    member: str,
    held: Sequence[tuple[int, int]],
    ttl: float,
    *,
    beat: Sequence[Any] | None,
    stand_down: bool,
) -> Round:
    """One round's statement (renew the ``held`` (partition, epoch) pairs, count): with the
    carried heartbeat's values ``beat``, as a member standing down when ``stand_down``."""
    parts, epochs = [p for p, _ in held], [e for _, e in held]
    args = (member, parts, epochs, ttl, ttl * 10, _LEADER_KEY >> 32, _LEADER_KEY & 0xFFFFFFFF)
    if stand_down:
        row = await conn.fetchrow(ROUNDS_STOOD_DOWN[beat is not None], *args, *(beat or ()))
    elif beat is None:
        row = await conn.fetchrow(ROUND, *args)
    else:
        row = await conn.fetchrow(ROUND_BEAT, *args, *beat)
    carried = beat is not None
    return Round(
        renewed=frozenset(row[0]),
        live=int(row[1]),
        recent=row[2],
        coming=row[3],
        leader_locked=row[4],
        until=row[5],
        beaten=bool(row[6]) if carried else False,
        due=int(row[7]) if carried else 0,
        now=row[-1],
    )


async def take(
    conn: Any, member: str, ttl: float, wanted: int, now: datetime
) -> list[tuple[int, int, Any]]:
    """Take up to ``wanted`` claimable partitions: (partition, epoch, first_held_at) of each
    taken (``first_held_at`` is a column: untrusted)."""
    rows = await conn.fetch(TAKE, member, ttl, wanted, now)
    return [(int(r[0]), int(r[1]), r[2]) for r in rows]


async def release(conn: Any, member: str, held: Sequence[tuple[int, int]]) -> None:
    """Clear the holder of the ``held`` (partition, epoch) pairs (a lease since taken by another
    manager is left as it is) and announce them on :data:`FREED`."""
    await conn.execute(RELEASE, member, [p for p, _ in held], [e for _, e in held])


async def leave(conn: Any, member: str) -> None:
    """Delete this manager's member row."""
    await conn.execute(LEAVE, member)


async def announce_join(conn: Any, member: str) -> None:
    """Tell the other managers' lease connections that ``member`` joins."""
    await conn.execute(ANNOUNCE, FREED, JOINED + member)


async def set_keepalives(conn: Any, settings: dict[str, str]) -> None:
    """Set the session's server ``settings`` (those the server lacks are skipped)."""
    await conn.fetchval(SET_KEEPALIVES, list(settings), list(settings.values()))


async def try_liveness_lock(conn: Any, member: str) -> bool:
    """Take ``member``'s liveness lock on this session without waiting; whether it is held."""
    return bool(await conn.fetchval(ACQUIRE, member))


async def release_stale(conn: Any, member: str) -> None:
    """Release the leases still naming ``member`` and announce them on :data:`FREED`."""
    await conn.execute(RELEASE_STALE, member, FREED)


async def orphaned(conn: Any, member: str) -> list[int]:
    """The live leases of other holders whose liveness lock is free."""
    return list(await conn.fetchval(ORPHANED, member) or [])
