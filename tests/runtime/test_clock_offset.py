"""This manager's wall clock against the database's (runtime.clock_offset): the offset rule and
jumps on a virtual clock, and the leases that take nothing while the clock is off (real
PostgreSQL, whose now() is the clock measured against)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from periodic_manager.clock import VirtualClock
from periodic_manager.db.migrate import upgrade
from periodic_manager.runtime.clock_offset import ClockOffset, ClockWatch, DatabaseTime
from periodic_manager.runtime.leadership import LockLeadership
from periodic_manager.runtime.partitions import PartitionLeases
from tests.support.faults import dsn

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class Database:
    """A database clock ``skew`` seconds behind the virtual clock (the manager's clock is
    ahead by ``skew``); each read takes ``trip`` seconds, answered at its middle."""

    def __init__(self, clock: VirtualClock, skew: float = 0.0, trip: float = 0.0) -> None:
        self.clock = clock
        self.skew = skew
        self.trip = trip
        self.reads = 0

    async def now(self) -> datetime:
        self.reads += 1
        self.clock.elapse(self.trip / 2)
        answer = self.clock.now() - timedelta(seconds=self.skew)
        self.clock.elapse(self.trip / 2)
        return answer


async def test_the_offset_is_measured_at_the_middle_of_the_round_trip() -> None:
    clock = VirtualClock(T0)
    db = Database(clock, skew=1.0, trip=0.8)
    offset = ClockOffset(clock, limit=7.5, read=db.now)
    assert await offset.measure()
    assert offset.offset == pytest.approx(1.0) and offset.error == pytest.approx(0.4)
    assert offset.agrees and offset.check() == "ok"


async def test_beyond_the_bound_it_is_said_once_and_beyond_the_limit_nothing_is_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = VirtualClock(T0)
    db = Database(clock, skew=3.0)
    offset = ClockOffset(clock, limit=7.5, read=db.now)
    with caplog.at_level(logging.INFO, "periodic_manager.runtime.clock_offset"):
        for _ in range(3):
            assert await offset.measure()
        assert offset.agrees and offset.check().startswith("skewed: this clock is 3.0 s ahead")
        assert [r.levelname for r in caplog.records] == ["WARNING"]  # once, not at every measure
        db.skew = -9.0  # now 9 s behind: beyond grace / 4
        await offset.measure()
        assert not offset.agrees and offset.check().startswith("failed: this clock is 9.0 s behind")
        db.skew = 0.5
        await offset.measure()
        assert offset.agrees and offset.check() == "ok"
    levels = [r.levelname for r in caplog.records]
    assert levels == ["WARNING", "ERROR", "INFO", "WARNING"], levels  # said, refused, agrees again


async def test_an_answer_that_is_no_instant_measures_nothing() -> None:
    clock = VirtualClock(T0)
    offset = ClockOffset(clock, limit=7.5)
    for answer in (None, "2026-03-01", T0.replace(tzinfo=None), 12.5):
        offset.observe(offset.begin(), answer)
    assert offset.offset is None and offset.agrees


@pytest.mark.parametrize("step", [-120.0, 60.0, -3.0])
async def test_a_jump_of_the_wall_clock_is_noticed_at_the_next_tick_and_measured_before_sending(
    step: float,
) -> None:
    clock = VirtualClock(T0)
    db = Database(clock)
    offset = ClockOffset(clock, limit=7.5, read=db.now)
    watch = ClockWatch(offset)
    await watch.measure()
    await watch.tick()
    for _ in range(5):  # time passing at its pace is no jump
        await clock.advance(1.0)
        await watch.tick()
    assert db.reads == 1 and offset.jumps == 0
    clock.set(clock.now() + timedelta(seconds=step))  # the wall clock steps, monotonic does not
    db.skew = step  # the database kept true time: the step is now this clock's offset
    await watch.tick()  # the scheduler's next pass: the jump is measured before it sends
    assert db.reads == 2 and offset.jumps == 1 and not offset.stale
    assert offset.offset == pytest.approx(step) and offset.agrees == (abs(step) <= 7.5)
    await clock.advance(1.0)
    await watch.tick()
    assert db.reads == 2  # measured once per jump


async def test_a_jump_not_yet_measured_agrees_with_nothing() -> None:
    clock = VirtualClock(T0)
    offset = ClockOffset(clock, limit=7.5)  # nothing to measure with
    offset.tick()
    clock.set(clock.now() - timedelta(seconds=120))
    assert offset.tick() and offset.stale and not offset.agrees
    assert offset.check().startswith("failed: the wall clock jumped")


async def test_leases_take_nothing_while_the_clock_is_off_and_take_again_once_it_agrees(
    pg_url: str,
) -> None:
    """On PostgreSQL's own clock: a manager whose clock is 30 s ahead (beyond grace / 4) hands
    every partition over at its next round and takes none; a jump makes the fence drop every
    partition before the next send; once its clock agrees again it takes them back."""
    await upgrade(pg_url)
    admin = await asyncpg.connect(dsn(pg_url))
    real = await admin.fetchval("SELECT now()")
    clock = VirtualClock(real)  # the database's time: this clock agrees with it
    leases = PartitionLeases(dsn(pg_url), "a", clock=clock, ttl=10.0)
    leases.offset = ClockOffset(clock, limit=7.5)
    try:
        await leases.start(lambda _v: None)
        assert leases.offset.offset is not None and abs(leases.offset.offset) < 5
        count = len(leases.held)
        assert count > 0
        clock.set(clock.now() + timedelta(seconds=30))  # the wall clock steps 30 s forward
        assert leases.offset.tick() and not leases.offset.agrees  # the scheduler's tick sees it
        await leases.round()  # ... and a round measures it before the send: 30 s ahead
        assert leases.offset.offset is not None and leases.offset.offset > 25
        assert not leases.held and not leases.offset.agrees
        held = await admin.fetchval("SELECT count(*) FROM pm_partitions WHERE holder = 'a'")
        assert held == 0  # handed over (released), so another manager takes them at once
        await leases.round()
        assert not leases.held  # takes none while its clock is off
        clock.set(clock.now() - timedelta(seconds=30))  # corrected
        await leases.round()
        assert leases.offset.agrees and len(leases.held) == count
        clock.set(clock.now() + timedelta(seconds=60))  # a jump, not measured yet
        assert leases.offset.tick()
        leases.expire()  # the fence right before a send drops every partition
        assert not leases.held
    finally:
        await leases.stop()
        await admin.close()


async def test_slots_are_judged_on_the_databases_time_as_measured() -> None:
    """A clock 5 s ahead (within grace / 4) judges slots 5 s back: neither early nor late; a
    sleep until an instant of that time ends when the database's clock reaches it."""
    clock = VirtualClock(T0)
    db = Database(clock, skew=5.0)
    offset = ClockOffset(clock, limit=7.5, read=db.now)
    slots = DatabaseTime(clock, offset)
    assert slots.now() == T0  # not measured yet: the wall clock
    await offset.measure()
    assert slots.now() == T0 - timedelta(seconds=5) and slots.monotonic() == clock.monotonic()
    woke: list[datetime] = []

    async def sleeper() -> None:
        await slots.sleep_until(T0)
        woke.append(clock.now())

    task = asyncio.ensure_future(sleeper())
    await clock.advance(4.9)
    assert not woke
    await clock.advance(0.2)
    assert woke == [T0 + timedelta(seconds=5)]  # the database's T0
    await task
    db.skew = 30.0  # beyond the limit: nothing is sent, and what is written is in its time
    await offset.measure()
    assert slots.now() == clock.now() - timedelta(seconds=30)


async def test_a_leader_whose_clock_is_off_steps_down_before_the_next_send(pg_url: str) -> None:
    """Leader mode: a jump measured beyond grace / 4 steps the leader down in the scheduler's
    tick (the pass that follows sends nothing), its session ends so the standby takes the lock,
    and it does not try for the lock again until its clock agrees."""
    clock = VirtualClock(T0)
    db = Database(clock)
    offset = ClockOffset(clock, limit=7.5, read=db.now)
    a = LockLeadership(dsn(pg_url), clock=clock, poll_interval=1.0, timeout=3.0)
    b = LockLeadership(dsn(pg_url), clock=clock, poll_interval=1.0, timeout=3.0)
    a.may_lead = lambda: offset.agrees
    watch = ClockWatch(offset)
    watch.step_down = a.step_down
    try:
        await a.start(lambda _v: None)
        await b.start(lambda _v: None)
        await watch.measure()
        await watch.tick()
        assert a.is_leader and not b.is_leader
        clock.set(clock.now() + timedelta(seconds=60))  # a's wall clock steps
        db.skew = 60.0
        await watch.tick()  # the scheduler's next pass: measured, off, stepped down at once
        assert not a.is_leader and not offset.agrees
        for _ in range(50):  # the standby takes the lock at its next tries; a does not try
            await clock.advance(1)
            await watch.tick()
            if b.is_leader:
                break
            await asyncio.sleep(0.1)  # the server ends a's session on real time
        assert b.is_leader and not a.is_leader
        clock.set(clock.now() - timedelta(seconds=60))  # corrected
        db.skew = 0.0
        await watch.tick()
        assert offset.agrees
        await b.stop()
        # (a's poll, armed before the step back, waits 60 s more of this virtual wall clock; a
        # real one's timers run on monotonic time)
        for _ in range(120):
            await clock.advance(1)
            if a.is_leader:
                break
            await asyncio.sleep(0.1)
        assert a.is_leader  # leads again once its clock agrees
    finally:
        await a.stop()
        await b.stop()


@pytest.mark.parametrize(("grace", "limit"), [(0.0, 1.0), (5.0, 1.25)])
async def test_a_small_grace_keeps_a_usable_limit(grace: float, limit: float) -> None:
    """PM_GRACE may be 0 or a few seconds: the limit (grace / 4) is then at least 1 s and the
    warning bound at most the limit (a grace of 5 s made every manager fail at start)."""
    clock = VirtualClock(T0)
    db = Database(clock, skew=0.5)
    offset = ClockOffset(clock, limit=grace / 4, read=db.now)
    assert offset.limit == limit and offset.bound == limit
    assert await offset.measure()
    assert offset.agrees and offset.check() == "ok"  # half a second off: within both
    db.skew = 1.5
    assert await offset.measure()
    assert not offset.agrees and offset.check().startswith("failed:")


def test_a_manager_starts_with_a_grace_below_four_times_the_warning_bound() -> None:
    from periodic_manager.runtime.manager import PeriodicTaskManager
    from periodic_manager.runtime.timing import Timing
    from periodic_manager.targets.memory import MemoryTarget

    mgr = PeriodicTaskManager(
        None, MemoryTarget(), timing=Timing(grace=5.0), clock=VirtualClock(T0)
    )
    assert mgr.clock_offset.limit == 1.25 and mgr.clock_offset.bound == 1.25
