"""Liveness locks on a real PostgreSQL: a dead manager's leases are taken at once (its session
and so its lock are gone), a live one's never before their expiry, and a manager whose lease
connection ended stops sending for everything at once (fencing).

Rounds come on a VirtualClock; the watch polls on it too (``POLL_S``). Death is the end of a
manager's session, as PostgreSQL sees a SIGKILLed process's: its connection closed, no hand-over.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import asyncpg
import pytest

from periodic_manager.clock import VirtualClock
from periodic_manager.db.leases import ORPHANS, SEED
from periodic_manager.db.migrate import upgrade
from periodic_manager.runtime.liveness_lock import POLL_S
from periodic_manager.runtime.partitions import PartitionLeases
from tests.runtime.test_partitions import Recorder
from tests.support.faults import dsn
from tests.support.polling import eventually
from tests.support.tcpproxy import TcpProxy

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
N = 64
TTL = 30.0  # far longer than any test here: nothing is taken by expiry

Make = Callable[..., tuple[PartitionLeases, Recorder]]


@pytest.fixture
async def admin(pg_url: str) -> AsyncIterator[asyncpg.Connection]:
    await upgrade(pg_url)
    conn = await asyncpg.connect(dsn(pg_url))
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(T0)


@pytest.fixture
async def make(pg_url: str, admin: asyncpg.Connection, clock: VirtualClock) -> AsyncIterator[Make]:
    made: list[PartitionLeases] = []

    def build(name: str, url: str | None = None) -> tuple[PartitionLeases, Recorder]:
        leases = PartitionLeases(url or dsn(pg_url), name, clock=clock, ttl=TTL)
        rec = Recorder(name)
        rec.leases = leases
        leases.attach(rec)
        made.append(leases)
        return leases, rec

    yield build
    for leases in made:
        await leases.stop()


async def two(make: Make, share: int = N // 2) -> tuple[PartitionLeases, PartitionLeases]:
    a, _ = make("a")
    await a.start(lambda _v: None)
    b, _ = make("b")
    await b.start(lambda _v: None)  # joins: a hands half over at once (its notification)
    for _ in range(3):
        await a.round()
        await b.round()
    assert len(a.held) == len(b.held) == share
    return a, b


async def die(leases: PartitionLeases) -> None:
    """The process is gone: its loops stop and its session ends, nothing handed over."""
    assert leases.task is not None
    leases.task.cancel()
    await asyncio.gather(leases.task, return_exceptions=True)
    leases._task = None
    leases._conn.terminate()


async def polls(clock: VirtualClock, done: Callable[[], bool], what: str) -> None:
    """Let the watch poll (virtual time, a poll at a time) until ``done``; a second at most."""

    async def step() -> bool:
        if not done():
            await clock.advance(POLL_S)
        return done()

    await eventually(step, what, seconds=10, interval=0.05)


async def orphaned(admin: asyncpg.Connection, member: str) -> None:
    """Wait until the server ended ``member``'s session (its lock is free)."""

    async def check() -> bool:
        return bool(await admin.fetchval(f"SELECT $1 IN ({ORPHANS})", member))

    await eventually(check, f"{member}'s liveness lock free")


async def live_leases(admin: asyncpg.Connection, holder: str) -> int:
    return int(
        await admin.fetchval(
            "SELECT count(*) FROM pm_partitions WHERE holder = $1 AND expires_at > now()", holder
        )
    )


async def test_a_dead_managers_partitions_are_taken_at_once_not_at_the_lease_ttl(
    make: Make, admin: asyncpg.Connection, clock: VirtualClock
) -> None:
    a, b = await two(make)
    assert await admin.fetchval("SELECT bool_and(liveness_lock) FROM pm_partition_members")
    await die(b)
    # Its leases run on in the database (TTL 30 s), its membership too: only its lock is gone.
    assert await live_leases(admin, "b") == N // 2
    await orphaned(admin, "b")
    await polls(clock, lambda: a.held == frozenset(range(N)), "a takes every partition")
    # Taken by the watch's round: well within a round interval (10 s) of the virtual clock,
    # and the database's own clock never saw b's leases expire.
    assert (clock.now() - T0).total_seconds() < TTL / 3
    assert set(
        r[0] for r in await admin.fetch("SELECT holder FROM pm_partitions WHERE expires_at > now()")
    ) == {"a"}


async def test_a_live_holder_and_one_without_a_liveness_lock_are_never_taken_before_expiry(
    make: Make, admin: asyncpg.Connection, clock: VirtualClock
) -> None:
    """The lock frees a lease only when its holder said it holds one and no session holds it:
    a live manager's stay, and so do those of a manager that never took one (an older version
    during a rolling upgrade): the TTL bounds them as before."""
    await admin.execute(
        "UPDATE pm_partitions SET holder = 'old', epoch = epoch + 1,"
        " expires_at = now() + interval '1 hour' WHERE partition < 16"
    )
    await admin.execute(
        "INSERT INTO pm_partition_members VALUES ('old', now() + interval '1 hour')"
    )
    a, b = await two(make, share=22)  # 'old' is counted among the live
    for _ in range(6):
        await clock.advance(POLL_S)
        await asyncio.sleep(0.02)
    await a.round()
    await b.round()
    assert await live_leases(admin, "old") == 16
    assert len(a.held) == len(b.held) == 22


async def test_a_manager_whose_lease_connection_ends_stops_sending_at_once_and_takes_part_again(
    make: Make, admin: asyncpg.Connection, proxied: tuple[str, TcpProxy]
) -> None:
    """Its lock ended with its session, so the others may take its leases at once: it stops
    sending for every one of them at once, not at the trust's end (TTL - margin). Connected
    again, it releases the leases still naming it (it dropped them) and takes a share."""
    url, proxy = proxied
    a, rec = make("a", dsn(url))
    await a.start(lambda _v: None)
    assert a.held == frozenset(range(N))
    await proxy.cut()  # the server sees the session end: the lock is free now
    await eventually(lambda: rec.of("lost") == set(range(N)), "every partition dropped")
    assert not a.held and not a.is_leader
    await orphaned(admin, "a")
    await proxy.restore()
    await a.round()
    assert a.held == frozenset(range(N))
    epochs = {r[0] for r in await admin.fetch("SELECT epoch FROM pm_partitions")}
    assert epochs == {2}  # taken again: a new epoch fences anything of the first hold


async def test_a_manager_whose_lock_a_lingering_session_holds_is_judged_by_its_ttl_alone(
    make: Make, admin: asyncpg.Connection, clock: VirtualClock
) -> None:
    """A session of a manager's last connection the server has not ended yet still holds its
    lock when it connects again: its rounds say it holds none (``liveness_lock`` false), so when
    that session ends its live leases are not taken as a dead manager's; its next round takes
    the lock and says so."""
    key = f"hashtextextended('a', {SEED})"
    assert await admin.fetchval(f"SELECT pg_try_advisory_lock({key})")  # the lingering session
    a, b = await two(make)
    assert not await admin.fetchval(
        "SELECT liveness_lock FROM pm_partition_members WHERE member = 'a'"
    )
    await admin.execute(f"SELECT pg_advisory_unlock({key})")  # that session ends
    for _ in range(4):
        await clock.advance(POLL_S)
        await asyncio.sleep(0.02)
    await b.round()
    assert len(a.held) == len(b.held) == N // 2  # a's leases are its own still
    await a.round()  # takes its lock now, and says so
    assert await admin.fetchval("SELECT liveness_lock FROM pm_partition_members WHERE member = 'a'")
    await b.round()
    assert len(a.held) == len(b.held) == N // 2
