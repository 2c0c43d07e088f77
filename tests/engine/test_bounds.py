"""options.start_at / options.end_at in the engine (virtual clock, in-memory target): no slot
before start_at (one exactly at it counts), none at or after end_at; the entry then has no next
slot and stops quietly; a takeover's look-back and a fire_once catch-up respect both bounds; the
memo shared by rows with the same schedule never leaks one row's bounds into another."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from periodic_manager.clock import VirtualClock
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.providers import StaticProvider
from periodic_manager.runtime.memory_store import MemoryRuntimeStore
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.targets.memory import MemoryTarget
from tests.engine.test_misfire import started

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def cfg(name: str, spec: str, i: int | None = None, **options: object) -> PeriodicTaskConfig:
    return PeriodicTaskConfig.create(
        name=name, spec=spec, task_type="demo.task", options=options, schedule_id=i
    )


@pytest.fixture
async def rig() -> AsyncIterator[tuple[Scheduler, VirtualClock, MemoryTarget]]:
    clock = VirtualClock(T0)
    target = MemoryTarget()
    sched = Scheduler(target, clock=clock, grace=30)
    task = asyncio.create_task(sched.run())
    await clock.settle()
    yield sched, clock, target
    sched.stop()
    await asyncio.wait_for(task, 5)


async def advance(sched: Scheduler, clock: VirtualClock, seconds: float) -> None:
    await clock.advance(seconds, settle=lambda: sched.wait_processed(clock.now()))


async def test_registered_before_start_at_first_sends_the_slot_exactly_at_start_at(rig) -> None:
    sched, clock, target = rig
    entry = sched.register(cfg("a", "@every 10s", start_at=iso(at(100))))
    assert entry.next_slot == at(100)  # a slot exactly at start_at counts
    await advance(sched, clock, 130)
    assert target.slots("a") == [at(s) for s in (100, 110, 120, 130)]


async def test_start_at_between_slots_begins_at_the_next_slot(rig) -> None:
    sched, clock, target = rig
    entry = sched.register(cfg("a", "@every 10s", start_at=iso(at(95))))
    assert entry.next_slot == at(100)


async def test_end_passes_while_running_the_entry_stops_quietly(rig) -> None:
    sched, clock, target = rig
    entry = sched.register(cfg("a", "@every 10s", end_at=iso(at(40))))
    await advance(sched, clock, 100)
    assert target.slots("a") == [at(s) for s in (10, 20, 30)]  # none at or after end_at
    assert entry.next_slot is None and entry.last_error is None  # ended, not failed


async def test_a_window_start_at_to_end_at(rig) -> None:
    sched, clock, target = rig
    sched.register(cfg("a", "@every 10s", start_at=iso(at(20)), end_at=iso(at(50))))
    await advance(sched, clock, 120)
    assert target.slots("a") == [at(s) for s in (20, 30, 40)]


async def test_registered_after_end_at_has_no_slot(rig) -> None:
    sched, clock, target = rig
    clock.set(at(200))
    entry = sched.register(cfg("a", "@every 10s", end_at=iso(at(100))))
    assert entry.next_slot is None and entry.last_error is None
    await advance(sched, clock, 60)
    assert target.slots("a") == []


async def test_rows_sharing_a_schedule_keep_their_own_bounds(rig) -> None:
    # One memo entry per (spec, zone, anchor): the bounds are applied outside it.
    sched, clock, target = rig
    sched.register(cfg("open", "@every 10s"))
    sched.register(cfg("late", "@every 10s", start_at=iso(at(30))))
    sched.register(cfg("short", "@every 10s", end_at=iso(at(20))))
    await advance(sched, clock, 50)
    assert target.slots("open") == [at(s) for s in (10, 20, 30, 40, 50)]
    assert target.slots("late") == [at(s) for s in (30, 40, 50)]
    assert target.slots("short") == [at(10)]


async def test_an_edit_moving_end_at_earlier_drops_the_pending_slot(rig) -> None:
    sched, clock, target = rig
    sched.register(cfg("a", "@every 10s", 1))
    await advance(sched, clock, 15)
    entry = sched.register(cfg("a", "@every 10s", 1, end_at=iso(at(20))))
    assert entry.next_slot is None  # 20 is at end_at: not a slot any more
    await advance(sched, clock, 30)
    assert target.slots("a") == [at(10)]


async def test_takeover_look_back_sends_nothing_before_start_at(rig) -> None:
    sched, clock, target = rig
    sched.register(cfg("a", "@every 10s", start_at=iso(at(40))))
    sched.set_active(False)
    await advance(sched, clock, 50)
    await sched.rebase(clock.now() - timedelta(seconds=30))  # looks back to 20 (grace 30)
    sched.set_active(True)
    await advance(sched, clock, 0)
    assert target.slots("a") == [at(40), at(50)]  # not 30: before start_at


async def test_takeover_look_back_sends_nothing_at_or_after_end_at(rig) -> None:
    sched, clock, target = rig
    sched.register(cfg("a", "@every 10s", end_at=iso(at(40))))
    sched.set_active(False)
    await advance(sched, clock, 50)
    await sched.rebase(clock.now() - timedelta(seconds=30))
    sched.set_active(True)
    await advance(sched, clock, 30)
    assert target.slots("a") == [at(30)]  # strictly after 20; 40 is at end_at


async def test_fire_once_catch_up_respects_both_bounds() -> None:
    # Down since before 12:00; at 12:00:20 the latest missed minute is 12:00, within the window.
    now = datetime(2024, 5, 1, 12, 0, 20, tzinfo=UTC)
    clock, target, store = VirtualClock(now), MemoryTarget(), MemoryRuntimeStore()
    provider = StaticProvider(
        [
            cfg("early", "* * * * *", 1, misfire="fire_once", start_at="2024-05-01T12:00:10Z"),
            cfg("ended", "* * * * *", 2, misfire="fire_once", end_at="2024-05-01T11:59:30Z"),
            cfg("open", "* * * * *", 3, misfire="fire_once", start_at="2024-05-01T12:00:00Z"),
        ]
    )
    mgr = await started(provider, store, clock, target)
    try:
        assert target.slots("early") == []  # 12:00 is before its start_at
        # 12:00 is after its end; 11:59 is its latest slot before end_at, within the window.
        assert target.slots("ended") == [datetime(2024, 5, 1, 11, 59, tzinfo=UTC)]
        assert target.slots("open") == [datetime(2024, 5, 1, 12, 0, tzinfo=UTC)]  # at start_at
    finally:
        await mgr.stop()
