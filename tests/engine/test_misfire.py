"""Misfire policy: skip (default) and fire_once, on start and on takeover (virtual clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import RunRecord
from periodic_manager.providers import StaticProvider
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.runtime.memory_store import MemoryRuntimeStore
from periodic_manager.runtime.timing import Timing
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.targets.memory import MemoryTarget
from tests.support.managers import ManualLeader

T0 = datetime(2024, 5, 1, 12, 0, 20, tzinfo=UTC)


def row(i: int, name: str, spec: str, **options: object) -> PeriodicTaskConfig:
    return PeriodicTaskConfig.create(
        name=name, spec=spec, task_type="t", schedule_id=i, options=options
    )


async def started(
    provider: StaticProvider,
    store: MemoryRuntimeStore,
    clock: VirtualClock,
    target: MemoryTarget,
    leader: bool = True,
) -> PeriodicTaskManager:
    mgr = PeriodicTaskManager(
        provider,
        target,
        clock=clock,
        store=store,
        timing=Timing(grace=30, catchup_window=3600),
        leadership=ManualLeader(leader),
    )
    await mgr.start()
    await clock.settle()
    return mgr


async def test_fire_once_sends_the_latest_missed_slot_at_start_and_skip_sends_nothing() -> None:
    clock, target, store = VirtualClock(T0), MemoryTarget(), MemoryRuntimeStore()
    # Both schedules last ran at 09:00; the manager was down since.
    for key, name in (("1", "hourly.once"), ("2", "hourly.skip")):
        await store.record_runs(
            [RunRecord(key, name, T0.replace(hour=9, minute=0, second=0), "enqueued", T0)]
        )
    provider = StaticProvider(
        [
            row(1, "hourly.once", "0 * * * *", misfire="fire_once"),
            row(2, "hourly.skip", "0 * * * *"),
        ]
    )
    mgr = await started(provider, store, clock, target)
    try:
        assert target.slots("hourly.once") == [
            datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
        ]  # once, the latest
        assert target.slots("hourly.skip") == []
        task = target.messages[0][0]
        assert task.expires_at == task.scheduled_at + timedelta(
            hours=1
        )  # claim kept for the window
    finally:
        await mgr.stop()


async def test_fire_once_does_not_resend_a_slot_the_state_says_was_sent() -> None:
    clock, target, store = VirtualClock(T0), MemoryTarget(), MemoryRuntimeStore()
    await store.record_runs(
        [RunRecord("1", "h", datetime(2024, 5, 1, 12, 0, tzinfo=UTC), "enqueued", T0)]
    )
    mgr = await started(
        StaticProvider([row(1, "h", "0 * * * *", misfire="fire_once")]), store, clock, target
    )
    try:
        assert target.messages == []
    finally:
        await mgr.stop()


async def test_fire_once_ignores_a_slot_older_than_its_catchup_window() -> None:
    clock, target, store = VirtualClock(T0), MemoryTarget(), MemoryRuntimeStore()
    provider = StaticProvider(
        [row(1, "daily", "0 6 * * *", misfire="fire_once", catchup_window=3600)]
    )
    mgr = await started(provider, store, clock, target)
    try:
        assert target.messages == []  # 06:00 is 6 h ago, beyond the 1 h window
    finally:
        await mgr.stop()


async def test_standby_sends_nothing_and_a_takeover_fills_the_gap_once() -> None:
    clock, store = VirtualClock(T0), MemoryRuntimeStore()
    target = MemoryTarget()  # shared, like a real Redis: claims dedupe across managers
    provider = StaticProvider(
        [
            row(1, "every10", "@every 10s"),
            row(2, "minutely.once", "* * * * *", misfire="fire_once"),
        ]
    )
    leader = await started(provider, store, clock, target, leader=True)
    standby = await started(provider, store, clock, target, leader=False)
    try:
        await clock.advance(40, settle=lambda: leader.wait_settled(clock.now()))
        sent = target.slots("every10")
        assert sent == [T0 + timedelta(seconds=s) for s in (10, 20, 30, 40)]
        await leader.stop()  # dies silently at 12:01:00; the standby takes over 100 s later
        await clock.advance(100)
        await standby.leadership._set(True)  # type: ignore[attr-defined]
        await clock.advance(0, settle=lambda: standby.wait_settled(clock.now()))
        slots = target.slots("every10")
        assert len(slots) == len(set(slots))  # nothing twice
        # Within grace (30 s) of the takeover at 12:02:40: 12:02:20, :30, :40; older ones lost (skip).
        assert slots[4:] == [T0 + timedelta(seconds=s) for s in (120, 130, 140)]
        # fire_once: 12:00 caught up at the first start (no state yet), 12:01 by the leader, and
        # the latest missed minute (12:02) once at the takeover, though it is beyond grace.
        assert target.slots("minutely.once") == [
            datetime(2024, 5, 1, 12, m, tzinfo=UTC) for m in (0, 1, 2)
        ]
    finally:
        await standby.stop()
