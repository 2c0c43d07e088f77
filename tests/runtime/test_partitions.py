"""Partition leases on a real PostgreSQL: fair shares, clean hand-overs, expiry and fencing.

Rounds are driven by the test (``round()``) or by a VirtualClock; lease expiry in the database
is simulated by moving ``expires_at`` into the past, never by waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from sqlalchemy import BigInteger, literal, select

from periodic_manager.clock import VirtualClock, next_tick
from periodic_manager.contracts import PartitionLeadership
from periodic_manager.db.dialects import LEADER_LOCK_NAME, lock_key
from periodic_manager.db.engine import create_engine
from periodic_manager.db.leases import FREED
from periodic_manager.db.migrate import upgrade
from periodic_manager.db.partitions import partition_count, partition_sql
from periodic_manager.runtime.assemble import build_leadership
from periodic_manager.runtime.leadership import AlwaysLeader, LockLeadership
from periodic_manager.runtime.lease_round import fair_share
from periodic_manager.runtime.partitions import FREED_ROUNDS_PER_INTERVAL, PartitionLeases
from periodic_manager.schedules.partition import check_count, partition_of, ranges_text
from periodic_manager.settings import Settings
from tests.support.faults import dsn
from tests.support.polling import eventually
from tests.support.tcpproxy import TcpProxy

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
N = 64


class Recorder:
    """A PartitionHandler that notes what it was told, and the partitions its leases hold
    (a hand-over is checked: the partitions are no longer held when ``releasing`` runs)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.leases: PartitionLeases | None = None
        self.events: list[tuple[str, frozenset[int]]] = []
        self.first_held: dict[int, datetime] = {}

    async def gained(
        self, partitions: frozenset[int], fresh: frozenset[int], first_held: Mapping[int, datetime]
    ) -> None:
        self.events.append(("gained", partitions))
        self.events.append(("fresh", fresh))
        self.first_held.update(first_held)

    async def releasing(self, partitions: frozenset[int]) -> None:
        assert self.leases is not None and not partitions & self.leases.held  # stopped first
        self.events.append(("releasing", partitions))
        await asyncio.sleep(0)  # a flush takes its time; the lease is released after it

    def lost(self, partitions: frozenset[int]) -> None:
        self.events.append(("lost", partitions))

    def of(self, kind: str) -> set[int]:
        return {p for k, ps in self.events if k == kind for p in ps}


@pytest.fixture
async def db(pg_url: str) -> str:
    await upgrade(pg_url)
    return pg_url


@pytest.fixture
async def admin(db: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(dsn(db))
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(T0)


@pytest.fixture
async def make(db: str, clock: VirtualClock) -> AsyncIterator[object]:
    made: list[PartitionLeases] = []

    def build(name: str, url: str | None = None, **kw: float) -> tuple[PartitionLeases, Recorder]:
        leases = PartitionLeases(url or dsn(db), name, clock=clock, ttl=kw.pop("ttl", 10.0), **kw)
        rec = Recorder(name)
        rec.leases = leases
        leases.attach(rec)
        made.append(leases)
        return leases, rec

    yield build
    for leases in made:
        await leases.stop()


async def holders(admin: asyncpg.Connection) -> dict[int, str | None]:
    return {r[0]: r[1] for r in await admin.fetch("SELECT partition, holder FROM pm_partitions")}


async def rounds(*leases: PartitionLeases, times: int = 3) -> None:
    for _ in range(times):
        for x in leases:
            await x.round()


def assert_disjoint(sets: Iterable[frozenset[int]]) -> None:
    seen: set[int] = set()
    for s in sets:
        assert not s & seen, f"partitions held twice: {sorted(s & seen)}"
        seen |= s


async def test_migrate_makes_the_partitions_and_the_rule_is_the_same_in_python_and_sql(
    db: str, admin: asyncpg.Connection
) -> None:
    assert sorted((await holders(admin)).keys()) == list(range(N))
    engine = create_engine(db)
    try:
        async with engine.connect() as conn:
            for i in (1, 2, 63, 64, 65, 1000, 2**40 + 7):
                got = (
                    await conn.execute(select(partition_sql(literal(i, BigInteger), N)))
                ).scalar_one()
                assert got == partition_of(i, N)
    finally:
        await engine.dispose()
    with pytest.raises(ValueError, match="PM_PARTITIONS: 0 is out of range"):
        check_count("0")
    with pytest.raises(ValueError, match="PM_PARTITIONS: 'x' is not a whole number"):
        check_count("x")


async def test_a_manager_alone_holds_every_partition(make, admin: asyncpg.Connection) -> None:
    a, rec = make("a")
    changes: list[bool] = []
    await a.start(changes.append)
    assert isinstance(a, PartitionLeadership)
    assert a.count == N and a.held == frozenset(range(N)) and a.is_leader
    assert changes == [True]
    assert rec.of("gained") == rec.of("fresh") == set(range(N))  # never held before
    assert not rec.first_held  # told for partitions held before only
    assert set((await holders(admin)).values()) == {"a"}
    first = await admin.fetch("SELECT first_held_at FROM pm_partitions")
    assert {r[0] for r in first} == {T0}  # the taking manager's clock, for every partition


async def test_an_epoch_written_at_its_maximum_starts_again_instead_of_failing_every_take(
    make, admin: asyncpg.Connection
) -> None:
    """A hand-written epoch is untrusted: at bigint's maximum, ``epoch + 1`` overflowed and the
    one UPDATE that takes partitions failed for all of them (no schedule ran)."""
    await admin.execute("UPDATE pm_partitions SET epoch = 9223372036854775807 WHERE partition = 3")
    a, _ = make("a")
    await a.start(lambda _v: None)
    assert a.held == frozenset(range(N))
    assert await admin.fetchval("SELECT epoch FROM pm_partitions WHERE partition = 3") == 1


async def test_three_managers_share_fairly_and_each_partition_is_held_once(
    make, admin: asyncpg.Connection
) -> None:
    managers = [make(name)[0] for name in "abc"]
    for m in managers:
        await m.start(lambda _v: None)
    await rounds(*managers)
    share = fair_share(N, 3)
    assert share == 22
    sizes = sorted(len(m.held) for m in managers)
    assert sum(sizes) == N and sizes[-1] <= share  # at most one above the even share (21.3)
    assert_disjoint(m.held for m in managers)
    by_holder = await holders(admin)
    for m in managers:
        assert {p for p, h in by_holder.items() if h == m.member} == m.held


async def register(admin: asyncpg.Connection, name: str, started_ago: float = 0.0) -> None:
    """A manager row as a manager's start writes it (before its first lease round)."""
    await admin.execute(
        "INSERT INTO pm_managers (manager_id, hostname, pid, version, started_at, heartbeat_at)"
        " VALUES ($1, 'h', 1, 'v', now() - make_interval(secs => $2), now())",
        name,
        started_ago,
    )


async def test_managers_started_together_take_only_their_share_from_the_first_round(
    make, admin: asyncpg.Connection
) -> None:
    """Three managers registered (as their start does) before any lease round: at their first
    round they wait for one another, then the first one through a round takes a third, not
    everything to hand over later; none ever holds more than its share."""
    managers = [make(name)[0] for name in "abc"]
    for m in managers:
        await register(admin, m.member)
    await register(admin, "d")  # registered too, but it never takes part
    for m in managers:
        await m.start(lambda _v: None)
        assert not m.held  # others are starting: one round's wait
    for m in managers:
        await m.round()
        assert len(m.held) == fair_share(N, 4)  # "d" is coming
    await admin.execute(
        "UPDATE pm_managers SET started_at = now() - interval '11 seconds' WHERE manager_id = 'd'"
    )
    await rounds(*managers, times=1)
    assert sorted(len(m.held) for m in managers) == [20, 22, 22]
    await rounds(*managers)
    assert sorted(len(m.held) for m in managers) == [20, 22, 22]
    assert all(m.handovers == 0 for m in managers)  # nothing taken had to be handed over
    assert_disjoint(m.held for m in managers)


async def test_a_manager_that_never_comes_holds_the_others_back_at_most_one_ttl(
    make, admin: asyncpg.Connection
) -> None:
    """A manager row registered long ago (a dead one not yet reaped) is not waited for; one
    registered now but never taking part is waited for until its registration is ``ttl`` old."""
    await register(admin, "dead", started_ago=60)
    a, _ = make("a", ttl=3.0)
    await a.start(lambda _v: None)
    assert a.held == frozenset(range(N))  # alone: everything at once
    await a.stop()
    await register(admin, "late")
    b, _ = make("b", ttl=3.0)
    await b.start(lambda _v: None)
    assert not b.held  # another manager is starting: b waits one round
    await b.round()
    assert len(b.held) == 32  # "late" is coming
    await admin.execute(
        "UPDATE pm_managers SET started_at = now() - interval '4 seconds' WHERE manager_id = 'late'"
    )
    await b.round()
    assert b.held == frozenset(range(N))


async def test_a_first_round_that_took_nothing_is_followed_exactly_one_interval_later(
    make, admin: asyncpg.Connection, clock: VirtualClock
) -> None:
    """Rounds come on the clock's ticks, but the wait for managers starting together is one
    whole round, to the instant: a tick a moment after the first round would not give them time
    to register, and the tick after the whole round would leave every partition unheld for up to
    one more round at every fleet start."""
    await register(admin, "late")  # another manager starting: b's first round takes nothing
    b, _ = make("b", ttl=3.0)  # rounds every second, on whole seconds
    clock.set(T0 + timedelta(seconds=0.9))  # the next tick is 0.1 s away
    await b.start(lambda _v: None)
    assert not b.held
    await clock.advance_to(T0 + timedelta(seconds=1.5))  # past a tick, not a whole round yet
    await asyncio.sleep(0.1)  # a round would answer from the real database meanwhile
    assert not b.held
    await clock.advance_to(T0 + timedelta(seconds=1.9))  # a whole round later, before a tick

    await eventually(lambda: len(b.held) == 32, "b takes its share at the round after the wait")


async def test_a_joining_manager_takes_its_share_by_a_clean_hand_over(
    make, admin: asyncpg.Connection
) -> None:
    a, ra = make("a")
    b, rb = make("b")
    await a.start(lambda _v: None)
    epochs = {r[0]: r[1] for r in await admin.fetch("SELECT partition, epoch FROM pm_partitions")}
    await b.start(lambda _v: None)
    assert not b.held  # nothing free yet: a hands over at its next round
    for _ in range(3):
        for m in (a, b):
            await m.round()
            assert_disjoint([a.held, b.held])  # never held twice, at any step
    assert len(a.held) == len(b.held) == 32
    assert ra.of("releasing") == set(b.held) == rb.of("gained")
    assert not rb.of("fresh")  # held before: b looks back as a takeover does
    # ... but no further than when a first took them (a's clock then): nobody owes older slots.
    assert rb.first_held == {p: T0 for p in b.held}
    assert a.handovers == 32 and not ra.of("lost")
    after = {r[0]: r[1] for r in await admin.fetch("SELECT partition, epoch FROM pm_partitions")}
    assert all(after[p] == epochs[p] + 1 for p in b.held)  # a take bumps the fencing epoch
    first = await admin.fetch("SELECT first_held_at FROM pm_partitions")
    assert {r[0] for r in first} == {T0}  # a later take keeps the first one's instant


async def test_a_partition_held_before_its_first_hold_was_recorded_looks_back_unbounded(
    make, admin: asyncpg.Connection, clock: VirtualClock
) -> None:
    """A partition held before migration 0022 (an epoch, no first_held_at) is neither fresh
    nor bounded: its next holder looks back the full grace, and nothing is recorded for it."""
    await admin.execute("UPDATE pm_partitions SET epoch = 7 WHERE partition IN (3, 4)")
    await clock.advance(5)
    a, rec = make("a")
    await a.start(lambda _v: None)
    assert a.held == frozenset(range(N))
    assert rec.of("fresh") == set(range(N)) - {3, 4} and not rec.first_held
    first = {
        r[0]: r[1] for r in await admin.fetch("SELECT partition, first_held_at FROM pm_partitions")
    }
    assert first == {p: None if p in (3, 4) else T0 + timedelta(seconds=5) for p in range(N)}


async def test_a_first_hold_written_in_the_future_bounds_no_look_back(
    make, admin: asyncpg.Connection, clock: VirtualClock
) -> None:
    """``first_held_at`` is data like any column: one later than the take itself (written by
    hand) would make the takeover skip every slot up to it. It is ignored: the full grace."""
    await admin.execute(
        "UPDATE pm_partitions SET epoch = 7, first_held_at = '9999-01-01T00:00:00Z' WHERE partition = 3"
    )
    await admin.execute(
        "UPDATE pm_partitions SET epoch = 7, first_held_at = $1 WHERE partition = 4", T0
    )
    await clock.advance(5)
    a, rec = make("a")
    await a.start(lambda _v: None)
    assert a.held == frozenset(range(N))
    assert 3 not in rec.of("fresh") and rec.first_held == {4: T0}


async def test_a_stopping_manager_releases_at_once_and_the_others_take_over(
    make, admin: asyncpg.Connection
) -> None:
    a, ra = make("a")
    b, _ = make("b")
    await a.start(lambda _v: None)
    await b.start(lambda _v: None)
    await rounds(a, b)
    had = set(a.held)
    await a.stop()
    assert ra.of("releasing") >= had and not a.held
    by_holder = await holders(admin)
    # Released, not left to expire (their leases ran 10 s more): free, or b's already (the
    # release woke b's loop for a round).
    assert all(by_holder[p] in (None, "b") for p in had)
    assert await admin.fetchval("SELECT count(*) FROM pm_partition_members WHERE member = 'a'") == 0
    await b.round()
    assert b.held == frozenset(range(N))


async def test_a_join_and_a_hand_over_are_announced_and_answered_at_once_not_at_the_next_round(
    make, clock: VirtualClock
) -> None:
    """A manager's first round among others announces its join (NOTIFY): a holder of more than
    the new share runs a round at once and hands the excess over, which is announced too, and
    the joiner takes it. The virtual clock stands still here, so no round comes on a tick: a
    manager alone first through its round (the others not registered yet) stops reading every
    row within a round trip of their join."""
    a, ra = make("a")
    b, _ = make("b")
    await a.start(lambda _v: None)
    assert a.held == frozenset(range(N))
    await b.start(lambda _v: None)
    await eventually(lambda: len(b.held) == 32, "b's join brings a's hand-over, and b takes it")
    assert len(a.held) == 32 and ra.of("releasing") == set(b.held)
    assert_disjoint([a.held, b.held])
    await a.stop()
    await eventually(lambda: b.held == frozenset(range(N)), "b takes the rest when a leaves")


async def test_a_join_wakes_no_manager_that_holds_nothing(
    make, admin: asyncpg.Connection, clock: VirtualClock
) -> None:
    """Managers starting together wait one round for one another; each one's join is announced,
    but a manager holding nothing has nothing to hand over: it keeps waiting (a round then would
    take a share before the managers still starting had registered)."""
    a, _ = make("a")
    b, _ = make("b")
    for m in (a, b):
        await register(admin, m.member)
    await a.start(lambda _v: None)
    await b.start(lambda _v: None)  # b's join is announced to a, which holds nothing
    await asyncio.sleep(0.3)  # a round would answer from the real database meanwhile
    assert not a.held and not b.held
    await clock.advance(a.interval)  # the round after the wait: the shares
    await eventually(lambda: len(a.held) == len(b.held) == 32, "both take their share")
    assert a.handovers == b.handovers == 0


async def test_a_flood_of_notifications_brings_a_bounded_number_of_rounds(
    make, admin: asyncpg.Connection, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Anyone who can connect may NOTIFY the channel of freed partitions: between two rounds on
    the clock's ticks, notifications bring FREED_ROUNDS_PER_INTERVAL rounds at most (said once,
    at WARNING), not one each; the round on the next tick restores the budget. The virtual
    clock stands still meanwhile, so every round counted here was brought by a notification."""
    a, _ = make("a")
    await a.start(lambda _v: None)
    count = 0
    real = a.round

    async def counted() -> None:
        nonlocal count
        count += 1
        await real()

    a.round = counted  # type: ignore[method-assign]
    for i in range(FREED_ROUNDS_PER_INTERVAL):  # each waited for: none coalesced with another
        await admin.execute("SELECT pg_notify($1, $2)", FREED, f"someone-{i}")
        await eventually(lambda i=i: count == i + 1, f"notification {i} brings a round")
    for i in range(FREED_ROUNDS_PER_INTERVAL):
        await admin.execute("SELECT pg_notify($1, $2)", FREED, f"flood-{i}")
    await admin.execute("SELECT pg_notify($1, $2)", FREED, "last")
    await asyncio.sleep(0.3)  # rounds would come from the real database meanwhile
    await a.quiet()
    assert count == FREED_ROUNDS_PER_INTERVAL
    spent = [r for r in caplog.records if "notifications on pm_partitions_freed" in r.getMessage()]
    assert len(spent) == 1 and spent[0].levelname == "WARNING"
    await clock.advance(a.interval)  # the round on the next tick: the budget is back
    await eventually(lambda: count == FREED_ROUNDS_PER_INTERVAL + 1, "the round on the tick")
    await admin.execute("SELECT pg_notify($1, $2)", FREED, "after the tick")
    await eventually(
        lambda: count == FREED_ROUNDS_PER_INTERVAL + 2, "a notification brings a round again"
    )


async def test_a_dead_managers_partitions_are_taken_only_after_their_lease_expires(
    make, admin: asyncpg.Connection
) -> None:
    # A manager that died holding half the partitions (its leases and membership run on).
    await admin.execute(
        "UPDATE pm_partitions SET holder = 'dead', epoch = epoch + 1,"
        " expires_at = now() + interval '1 hour' WHERE partition < 32"
    )
    await admin.execute(
        "INSERT INTO pm_partition_members VALUES ('dead', now() + interval '1 hour')"
    )
    b, _ = make("b")
    await b.start(lambda _v: None)
    await rounds(b)
    assert b.held == frozenset(range(32, N))  # the fair share of two, none of the dead one's
    # Its TTL passes (database time): its leases and its membership have expired.
    await admin.execute(
        "UPDATE pm_partitions SET expires_at = now() - interval '1 second' WHERE holder = 'dead'"
    )
    await admin.execute("UPDATE pm_partition_members SET expires_at = now() - interval '1 second'")
    await b.round()
    assert b.held == frozenset(range(N))
    assert set((await holders(admin)).values()) == {"b"}


async def test_a_renewal_that_hangs_ends_trust_at_its_start_plus_ttl_minus_margin(
    make, proxied: tuple[str, TcpProxy], clock: VirtualClock
) -> None:
    """The network goes silent (a half-open connection: the server keeps the session, and the
    manager's liveness lock with it): the leases are trusted until the renewal's start + TTL -
    margin, no longer. (A connection that ends stops them at once: test_liveness_lock.py.)"""
    url, proxy = proxied
    url = dsn(url)
    a, rec = make("a", url, ttl=10.0, margin=2.0)  # rounds every 3.33 s, trust 8 s
    await a.start(lambda _v: None)
    assert a.held == frozenset(range(N))
    # Rounds come on the clock's ticks of 3.33 s: the first tick after the start renews,
    # trusted until that tick + 8 s.
    tick = next_tick(T0, 10 / 3)
    await clock.advance_to(tick)
    at_tick = clock.monotonic()

    def renewed() -> bool:  # its answer comes from the real database, on the wall clock
        return len(a._held) == N and all(t >= at_tick + 8 for _, t in a._held.values())

    await eventually(renewed, "the renewal that started at the first tick")
    assert a.held == frozenset(range(N)) and not rec.of("lost")
    proxy.freeze()  # every renewal from now on hangs
    for _ in range(79):  # up to the tick + 7.9 s: still trusted (the database keeps it till + 10)
        await clock.advance(0.1)
        await asyncio.sleep(0.005)
    assert a.trusted(0) and not rec.of("lost")
    for _ in range(2):  # the tick + 8.1 s
        await clock.advance(0.1)
        await asyncio.sleep(0.005)
    assert not a.trusted(0) and not a.held and not a.is_leader
    # The loop drops them when trust ends (it wakes at that instant of the virtual clock).
    await eventually(lambda: rec.of("lost") == set(range(N)), "every partition dropped")
    proxy.thaw()


@pytest.mark.parametrize(
    "step", [-120.0, 60.0], ids=["wall-clock-back-120s", "wall-clock-forward-60s"]
)
async def test_trust_runs_on_the_monotonic_clock_whatever_the_wall_clock_does(
    make, proxied: tuple[str, TcpProxy], clock: VirtualClock, step: float
) -> None:
    """A lease renewed at monotonic m is trusted until m + ttl - margin: a wall clock stepped
    back 120 s while its renewals hang does not lengthen that trust (it sent 123 s after the
    cut, for partitions others held), and one stepped forward 60 s does not end it early."""
    url, proxy = proxied
    a, rec = make("a", dsn(url), ttl=10.0, margin=2.0)  # trust 8 s after a round's start
    await a.start(lambda _v: None)
    started = clock.monotonic()
    assert a.held == frozenset(range(N))
    # No renewal from now on: frozen, not cut (a lease connection that ends drops every
    # partition at once, runtime.liveness_lock; here only the trust window may end them).
    proxy.freeze()
    clock.set(clock.now() + timedelta(seconds=step))  # the wall clock steps; monotonic does not
    a.expire()
    assert a.trusted(0) and a.held == frozenset(range(N)) and not rec.of("lost")
    while clock.monotonic() < started + 7.9:
        await clock.advance(0.1)
        await asyncio.sleep(0.005)
    assert a.trusted(0) and not rec.of("lost")  # a step forward ended nothing early
    while clock.monotonic() < started + 8.05:
        await clock.advance(0.05)
        await asyncio.sleep(0.005)
    a.expire()  # what the scheduler calls before every send
    assert not a.trusted(0) and not a.held  # a step back lengthened nothing
    assert rec.of("lost") == set(range(N))
    proxy.thaw()


async def test_the_epoch_refuses_a_stale_holder(make, admin: asyncpg.Connection) -> None:
    a, rec = make("a")
    await a.start(lambda _v: None)
    # Partition 0 was taken meanwhile by a successor under the same name (a restarted manager
    # with a fixed id), partition 1 by another manager: both at a newer epoch.
    await admin.execute("UPDATE pm_partitions SET epoch = epoch + 1 WHERE partition = 0")
    await admin.execute(
        "UPDATE pm_partitions SET holder = 'b', epoch = epoch + 1 WHERE partition = 1"
    )
    await a.round()
    assert rec.of("lost") == {0, 1}
    assert 0 not in a.held and 1 not in a.held
    before = await admin.fetch(
        "SELECT partition, holder, epoch, expires_at FROM pm_partitions WHERE partition < 2"
    )
    await a.stop()  # the release is fenced too: the newer leases are left alone
    after = await admin.fetch(
        "SELECT partition, holder, epoch, expires_at FROM pm_partitions WHERE partition < 2"
    )
    assert before == after


async def test_the_partition_count_is_chosen_at_migrate(
    pg_url: str, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PM_PARTITIONS", "5000")
    with pytest.raises(ValueError, match=r"PM_PARTITIONS: 5000 is out of range \(1..4096\)"):
        await upgrade(pg_url)
    monkeypatch.setenv("PM_PARTITIONS", "7")
    for url in (pg_url, sqlite_url):  # SQLite has the table too (its one manager holds all)
        await upgrade(url)
        engine = create_engine(url)
        try:
            async with engine.connect() as conn:
                assert await partition_count(conn) == 7
        finally:
            await engine.dispose()


def test_partitions_read_as_compact_ranges() -> None:
    assert ranges_text([40, *range(22), 40]) == "0-21, 40"
    assert ranges_text([5, 7, 6, 9]) == "5-7, 9"
    assert ranges_text([]) == ""


async def test_a_dead_managers_partitions_are_taken_right_after_their_expiry_not_a_round_later(
    make, admin: asyncpg.Connection, clock: VirtualClock
) -> None:
    """A round comes right after another holder's lease expires (what the last round read), not
    at the next tick: after a SIGKILL the partitions are held again at TTL + a moment, not TTL +
    up to one round."""
    await admin.execute(
        "UPDATE pm_partitions SET holder = 'dead', epoch = epoch + 1,"
        " expires_at = now() + interval '2 seconds' WHERE partition < 32"
    )
    await admin.execute(
        "INSERT INTO pm_partition_members VALUES ('dead', now() + interval '2 seconds')"
    )
    b, _ = make("b", ttl=9.0)  # rounds every 3 s, on the clock's ticks: T0 + 3 s is the next
    await b.start(lambda _v: None)
    assert b.held == frozenset(range(32, N))
    # The database's time passes the dead manager's expiry (moved there: no test waits for it).
    await admin.execute(
        "UPDATE pm_partitions SET expires_at = now() - interval '1 second' WHERE holder = 'dead'"
    )
    await admin.execute("UPDATE pm_partition_members SET expires_at = now() - interval '1 second'")
    await clock.advance_to(T0 + timedelta(seconds=1.5))
    await asyncio.sleep(0.1)  # a round would answer from the real database meanwhile
    assert b.held == frozenset(range(32, N))  # before the expiry the last round read: no round
    await clock.advance_to(T0 + timedelta(seconds=2.5))  # after it, before the tick at 3 s

    await eventually(lambda: b.held == frozenset(range(N)), "b takes them right after the expiry")


async def test_a_lease_written_to_expire_at_infinity_stops_no_round(
    make, admin: asyncpg.Connection
) -> None:
    """expires_at is a column like any: 'infinity' (which no subtraction takes) in another
    holder's leases leaves the rounds working; those partitions stay that holder's."""
    await admin.execute(
        "UPDATE pm_partitions SET holder = 'ghost', epoch = epoch + 1, expires_at = 'infinity'"
        " WHERE partition < 2"
    )
    b, _ = make("b")
    await b.start(lambda _v: None)
    await rounds(b)
    assert b._last_error is None
    assert b.held == frozenset(range(2, N))


async def test_trust_ends_on_time_with_the_renewal_in_flight_and_its_late_answer_changes_nothing(
    make, clock: VirtualClock
) -> None:
    """Leases expiring under load: the renewal hangs (held here until the test lets it answer),
    the send path asks :meth:`expire` at the trust's end and every partition is dropped; the
    renewal's late answer (the database did renew them) leaves them dropped and is no error."""
    a, rec = make("a", ttl=10.0, margin=2.0)
    await a.start(lambda _v: None)
    tick = next_tick(T0, 10 / 3)  # the loop's first round: trusted until tick + 8 s
    await clock.advance_to(tick)
    await asyncio.sleep(0.05)
    assert a.held == frozenset(range(N))
    answer = asyncio.Event()

    class Slow:
        """The leases' connection, whose queries answer only once ``answer`` is set."""

        def __init__(self, conn: asyncpg.Connection) -> None:
            self.conn = conn

        async def fetch(self, *args: object) -> object:
            await answer.wait()
            return await self.conn.fetch(*args)

        def __getattr__(self, name: str) -> object:
            return getattr(self.conn, name)

    a._conn = Slow(a._conn)
    in_flight = asyncio.ensure_future(a.round())
    await asyncio.sleep(0.05)
    clock.elapse((tick - clock.now()).total_seconds() + 8.1)  # the loop's round waits behind this
    assert not a.held and not rec.of("lost")  # not trusted any more, not dropped yet
    a.expire()  # as the scheduler does right before a send
    assert rec.of("lost") == set(range(N))
    answer.set()
    await in_flight
    assert a._last_error is None  # the late answer is no failure ...
    assert not a.held and not a._held  # ... and brings nothing back: the leases expire


async def test_no_partition_is_taken_while_a_leader_mode_manager_leads(
    make, admin: asyncpg.Connection
) -> None:
    """Every manager of a database must use one coordination; a leader-mode manager (an older
    one during a rolling upgrade to the auto default) holding the leader lock makes a partitions
    manager hand over what it holds and take nothing until the lock is free."""
    a, rec = make("a")
    await a.start(lambda _v: None)
    assert a.held == frozenset(range(N))
    key = lock_key(LEADER_LOCK_NAME)
    assert await admin.fetchval("SELECT pg_try_advisory_lock($1::bigint)", key)  # as a leader does
    try:
        await a.round()
        assert not a.held and rec.of("releasing") == set(range(N))
        assert set((await holders(admin)).values()) == {None}
        await a.round()
        assert not a.held
    finally:
        await admin.execute("SELECT pg_advisory_unlock($1::bigint)", key)
    await a.round()
    assert a.held == frozenset(range(N))


@pytest.mark.parametrize(
    ("url", "env", "mode", "kind"),
    [
        ("postgresql://u@h/db", {}, "partitions", PartitionLeases),
        ("postgresql://u@h/db", {"coordination": "leader"}, "leader", LockLeadership),
        ("postgresql://u@h/db", {"leader_election": True}, "leader", LockLeadership),
        ("postgresql://u@h/db", {"leader_election": False}, "leader", AlwaysLeader),
        ("mysql+asyncmy://u@h/db", {}, "leader", LockLeadership),
        ("sqlite:///x.db", {}, "leader", AlwaysLeader),
        ("sqlite:///x.db", {"coordination": "partitions"}, "leader", AlwaysLeader),
    ],
)
def test_the_default_coordination_is_partitions_on_postgresql_alone(
    url: str, env: dict[str, object], mode: str, kind: type
) -> None:
    """``auto`` (the default): partitions on PostgreSQL unless the leader election was set,
    leader elsewhere (MariaDB/MySQL: GET_LOCK; SQLite, whatever was named: one manager, always
    leader)."""
    settings = Settings(database_url=url, **env)  # type: ignore[arg-type]
    assert settings.coordination_mode == mode
    assert isinstance(build_leadership(settings), kind)


async def test_a_round_at_rest_is_one_round_trip(make, admin: asyncpg.Connection) -> None:
    """A manager holding its share renews, counts and checks for a leader-mode manager in one
    statement: it does so every ``ttl / 3`` for as long as it runs."""
    a, _ = make("a")
    await a.start(lambda _leading: None)
    b, _ = make("b")
    await b.round()  # b joins: it is counted (a hands over half) but takes nothing yet
    await rounds(a, b)
    assert len(a.held) == len(b.held) == N // 2
    sent: list[str] = []
    a._conn.add_query_logger(lambda q: sent.append(q.query))
    await a.round()
    await asyncio.sleep(0)  # the driver calls its query loggers soon after each query
    assert len(sent) == 1 and len(a.held) == N // 2
    # b dies (its membership and leases lapse): the statement counts it gone, a takes its share.
    for table, column in (("pm_partition_members", "member"), ("pm_partitions", "holder")):
        await admin.execute(
            f"UPDATE {table} SET expires_at = now() - interval '1 s' WHERE {column} = 'b'"
        )
    sent.clear()
    await a.round()
    await asyncio.sleep(0)
    assert len(sent) == 2 and len(a.held) == N  # the statement, then the take of b's share
