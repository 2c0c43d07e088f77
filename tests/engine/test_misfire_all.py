"""misfire "all": after an outage every missed slot within the catch-up window is sent once,
oldest first across schedules, paced at the catch-up rate (checked by virtual clock instants),
never one at or before the settled slot nor at or before effective_at (virtual clock, memory
target; tests/api/test_misfire_all_manager.py runs the same through a real manager)."""

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
RATE = 20.0  # two slots every 0.1 s


def row(
    i: int, name: str, spec: str, effective_at: datetime | None = None, **options: object
) -> PeriodicTaskConfig:
    return PeriodicTaskConfig.create(
        name=name,
        spec=spec,
        task_type="t",
        schedule_id=i,
        options=options,
        effective_at=effective_at,
    )


async def started(
    provider: StaticProvider,
    store: MemoryRuntimeStore,
    clock: VirtualClock,
    target: MemoryTarget,
    leader: bool = True,
    rate: float = RATE,
) -> PeriodicTaskManager:
    timing = Timing(grace=30, catchup_window=3600, catchup_rate=rate)
    mgr = PeriodicTaskManager(
        provider, target, clock=clock, store=store, timing=timing, leadership=ManualLeader(leader)
    )
    await mgr.start()
    await clock.settle()
    return mgr


def minute(h: int, m: int) -> datetime:
    return datetime(2024, 5, 1, h, m, tzinfo=UTC)


async def test_every_missed_slot_is_sent_oldest_first_at_the_paced_rate_after_the_settled_one() -> (
    None
):
    clock, target, store = VirtualClock(T0), MemoryTarget(), MemoryRuntimeStore()
    # "a" last settled 11:30, so 11:31..12:00 are missed (30 slots); "b" every ten minutes, none
    # settled: 11:10..12:00 within the hour (6 slots); "c" is skip: nothing.
    await store.record_runs([RunRecord("1", "a", minute(11, 30), "enqueued", minute(11, 30))])
    provider = StaticProvider(
        [
            row(1, "a", "* * * * *", misfire="all"),
            row(2, "b", "*/10 * * * *", misfire="all"),
            row(3, "c", "* * * * *"),
        ]
    )
    mgr = await started(provider, store, clock, target)
    try:
        await clock.advance(10)
        a = [minute(11, m) for m in range(31, 60)] + [minute(12, 0)]
        b = [minute(11, m) for m in (10, 20, 30, 40, 50)] + [minute(12, 0)]
        assert target.slots("a") == a
        assert target.slots("b") == b
        assert target.slots("c") == []
        sent = [(t.scheduled_at, t.idempotency_key, at) for t, at in target.messages]
        # Oldest first across the schedules, two every 0.1 s from the start.
        assert [s for s, _, _ in sent] == sorted(s for s, _, _ in sent)
        assert [at for _, _, at in sent] == [
            T0 + timedelta(seconds=0.1 * (i // 2)) for i in range(len(sent))
        ]
        assert all(key.endswith(s.strftime("%Y-%m-%dT%H:%M:%SZ")) for s, key, _ in sent)
        runs = [r for r in store.runs if r.status == "enqueued" and r.name == "a"]
        assert sorted(r.slot for r in runs)[1:] == a  # recorded (the first is 11:30 from before)
    finally:
        await mgr.stop()


async def test_none_at_or_before_effective_at_and_none_resent_after_a_restart() -> None:
    clock, target, store = VirtualClock(T0), MemoryTarget(), MemoryRuntimeStore()
    provider = StaticProvider(
        [row(1, "young", "* * * * *", effective_at=minute(11, 57), misfire="all")]
    )
    mgr = await started(provider, store, clock, target)
    try:
        await clock.advance(1)
        assert target.slots("young") == [minute(11, 58), minute(11, 59), minute(12, 0)]
    finally:
        await mgr.stop()
    target.forget()  # the broker lost its claims: only the database's settled slot protects
    again = await started(provider, store, clock, target)
    try:
        await clock.advance(1)
        assert target.slots("young") == [minute(11, 58), minute(11, 59), minute(12, 0)]
    finally:
        await again.stop()


async def test_a_takeover_sends_the_gap_once_and_leaves_grace_to_the_normal_path() -> None:
    clock, store, target = VirtualClock(T0), MemoryRuntimeStore(), MemoryTarget()
    provider = StaticProvider(
        [row(1, "m", "* * * * *", effective_at=minute(11, 59), misfire="all")]
    )
    leader = await started(provider, store, clock, target, leader=True)
    standby = await started(provider, store, clock, target, leader=False)
    try:
        await clock.advance(60, settle=lambda: leader.wait_settled(clock.now()))
        assert target.slots("m") == [minute(12, 0), minute(12, 1)]
        await leader.stop()  # gone at 12:01:20; the standby leads at 12:06:20
        await clock.advance(300)
        await standby.leadership._set(True)  # type: ignore[attr-defined]
        await clock.advance(5, settle=lambda: standby.wait_settled(clock.now()))
        # 12:06 is within grace of the takeover: the normal path sends it at once; the catch-up
        # sends 12:02 to 12:05, oldest first; each slot once.
        slots = target.slots("m")
        assert sorted(slots) == [minute(12, m) for m in range(0, 7)] and len(slots) == 7
        assert [s for s in slots if s < minute(12, 6)] == [minute(12, m) for m in range(0, 6)]
    finally:
        await standby.stop()


async def test_a_slot_whose_window_passes_before_its_turn_is_recorded_skipped() -> None:
    clock, target, store = VirtualClock(T0), MemoryTarget(), MemoryRuntimeStore()
    # @every 1s missed for a minute (61 slots in the 60 s window, both ends counted), caught up
    # at one slot every 2 s: every other one has left its window by its turn.
    provider = StaticProvider(
        [
            row(
                1,
                "fast",
                "@every 1s",
                effective_at=T0 - timedelta(seconds=100),
                misfire="all",
                catchup_window=60,
            )
        ]
    )
    mgr = await started(provider, store, clock, target, rate=0.5)
    try:
        await clock.advance(90, settle=lambda: mgr.wait_settled(clock.now()))
        late = [r for r in store.runs if r.status == "skipped" and r.reason == "late"]
        caught = [(t.scheduled_at, at) for t, at in target.messages if t.scheduled_at <= T0]
        assert late and caught
        assert all(at - slot <= timedelta(seconds=60) for slot, at in caught)
        assert all(r.at - r.slot > timedelta(seconds=60) for r in late)
        assert sorted(slot for slot, _ in caught) == [slot for slot, _ in caught]
        assert len(late) + len(caught) == 61
        assert len(caught) == len({slot for slot, _ in caught})
    finally:
        await mgr.stop()
