"""A manager at rest wakes as seldom as it can: its periodic loops wait for ticks of their period
(:func:`~periodic_manager.clock.next_tick`), so loops of one period wake together, and the wall
clock arms one timer for sleepers until one instant (one wakeup of the process for all)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from periodic_manager.clock import EPOCH, SystemClock, VirtualClock, next_tick
from periodic_manager.contracts import FailureCount
from periodic_manager.providers import StaticProvider
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.runtime.memory_store import MemoryRuntimeStore
from periodic_manager.runtime.timing import Timing
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.targets.memory import MemoryTarget

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def test_next_tick_is_the_next_whole_multiple_of_the_period_since_the_epoch() -> None:
    assert next_tick(T0, 5) == T0 + timedelta(seconds=5)  # on a tick: the next one
    assert next_tick(T0 + timedelta(seconds=1.3), 5) == T0 + timedelta(seconds=5)
    assert next_tick(T0 + timedelta(seconds=4.999999), 5) == T0 + timedelta(seconds=5)
    assert next_tick(T0, 30) == T0 + timedelta(seconds=30)
    third = next_tick(T0, 10 / 3)
    assert T0 < third <= T0 + timedelta(seconds=10 / 3)
    assert next_tick(third, 10 / 3) - third == timedelta(microseconds=3_333_333)
    # Always after now, whatever the microseconds.
    for us in (0, 1, 333_333, 999_999):
        now = T0 + timedelta(microseconds=us)
        assert now < next_tick(now, 0.5) <= now + timedelta(seconds=0.5)
    assert (next_tick(T0, 5) - EPOCH) % timedelta(seconds=5) == timedelta(0)


async def test_the_wall_clock_arms_one_deadline_for_sleepers_until_one_instant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    whens: list[float] = []
    call_at = loop.call_at

    def recording(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        if getattr(callback, "__module__", None) == "periodic_manager.clock":
            whens.append(when)  # the clock's timers (asyncio.sleep arms its own too)
        return call_at(when, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", recording)
    clock = SystemClock()
    instant = clock.now() + timedelta(milliseconds=20)

    async def sleeper() -> None:
        await asyncio.sleep(0.001)  # armed at another moment than the others
        await clock.sleep_until(instant)

    await asyncio.gather(clock.sleep_until(instant), sleeper(), sleeper())
    # One deadline, rounded up to the millisecond; the two clocks are read one after the other,
    # so on a loaded machine a reading may fall on the next millisecond: never further.
    assert len(whens) == 3 and len(set(whens)) <= 2 and max(whens) - min(whens) <= 0.0011
    assert all(abs(w * 1000 - round(w * 1000)) < 1e-6 for w in whens)  # whole milliseconds
    assert clock.now() >= instant
    whens.clear()
    await clock.sleep_until(clock.now())  # an instant that has come: a yield, no timer
    assert whens == []


async def test_waiting_for_one_event_on_the_wall_clock_makes_no_task() -> None:
    """sleep_unless made a task per event and one for the timer at every wait of every loop (a
    tenth of a millisecond of CPU each, four loops every 5 s)."""
    from periodic_manager.clock import sleep_unless

    clock = SystemClock()
    event = asyncio.Event()
    before = len(asyncio.all_tasks())
    waiting = asyncio.ensure_future(sleep_unless(clock, event, seconds=30))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == before + 1  # the waiter itself, nothing under it
    event.set()
    assert await waiting is True
    assert (
        await sleep_unless(clock, asyncio.Event(), until=clock.now() + timedelta(milliseconds=5))
        is False
    )
    assert await sleep_unless(clock, event, seconds=0) is True  # already set


async def test_the_virtual_clock_waits_for_an_event_until_an_instant_of_its_own_time() -> None:
    """sleep_unless asks the clock for its wait (a contract method, not a type check): on the
    virtual clock, the wait ends when the event is set or when virtual time reaches the instant,
    and leaves no sleeper behind."""
    from periodic_manager.clock import sleep_unless

    clock = VirtualClock(T0)
    event = asyncio.Event()
    waiting = asyncio.ensure_future(sleep_unless(clock, event, until=T0 + timedelta(seconds=10)))
    await clock.advance(9.999)
    assert not waiting.done()
    event.set()
    await clock.settle()
    assert waiting.done() and waiting.result() is True
    assert clock.next_deadline() is None  # its timer is gone with it
    event.clear()
    timed_out = asyncio.ensure_future(sleep_unless(clock, event, seconds=10))
    await clock.advance(10)
    assert timed_out.done() and timed_out.result() is False
    assert await clock.wait_until(event, T0) is False  # an instant that has come
    event.set()
    assert await clock.wait_until(event, T0 + timedelta(days=1)) is True


class Recording(VirtualClock):
    """A virtual clock that notes every deadline it is asked to wake a sleeper at."""

    def __init__(self, start: datetime) -> None:
        super().__init__(start)
        self.deadlines: list[datetime] = []

    async def sleep(self, seconds: float) -> None:
        self.deadlines.append(self.now() + timedelta(seconds=seconds))
        await super().sleep(seconds)

    async def sleep_until(self, instant: datetime) -> None:
        self.deadlines.append(instant)
        await super().sleep_until(instant)


async def test_an_idle_managers_periodic_loops_wake_together_on_ticks() -> None:
    """The early beat of a leadership change: after it, the heartbeat (and every loop of 5 s) is
    back on the ticks of its period instead of counting its period from its last wakeup, so the
    loops never drift apart and wake the process apart. The sync loop alone keeps its phase (its
    period counted from the last sync: when a row changed by SQL is seen is the same from start to
    start, as the end-to-end tests say): two wake-ups a minute."""
    start = T0 + timedelta(seconds=1.3)
    clock = Recording(start)
    yearly = PeriodicTaskConfig.create(name="y", spec="0 0 1 1 *", task_type="t", schedule_id=1)
    mgr = PeriodicTaskManager(
        StaticProvider([yearly]),
        MemoryTarget(),
        clock=clock,
        store=MemoryRuntimeStore(),
        timing=Timing(sync_interval=30, heartbeat_interval=5),
    )
    await mgr.start()
    try:
        await clock.advance(1.2)  # T0 + 2.5
        mgr.heartbeat.now.set()  # a leadership change: beat at once
        mgr.request_sync()  # an edit: sync at once
        await clock.advance(0)
        clock.deadlines.clear()
        await clock.advance(60)
        # Armed during the minute (T0 + 2.5 to T0 + 62.5) for instants within it: the ticks of
        # 5 s, one wake-up instant shared by every loop, and the sync loop's (30 s after the
        # sync at T0 + 32.5, itself 30 s after the requested one, armed before the window).
        window = {d for d in clock.deadlines if d <= T0 + timedelta(seconds=62.5)}
        syncs = {T0 + timedelta(seconds=62.5)}
        assert window == {T0 + timedelta(seconds=5 * k) for k in range(2, 13)} | syncs
        assert all((d - EPOCH) % timedelta(seconds=5) == timedelta(0) for d in window - syncs)
    finally:
        await mgr.stop()


class SilentSignal:
    """A change signal that never fires (LISTEN on a quiet database)."""

    task = None

    async def start(self, on_change: Any) -> None:
        return None

    async def stop(self) -> None:
        return None


async def test_with_a_change_signal_the_sync_loop_is_on_the_ticks_too() -> None:
    """Where a change signal carries the edits (LISTEN, MariaDB's poll) the periodic sync is a
    safety net: it comes on the ticks of its period, in the wake-ups the other loops share,
    instead of 30 s after the last sync (two wake-ups a minute of its own)."""
    start = T0 + timedelta(seconds=1.3)
    clock = Recording(start)
    yearly = PeriodicTaskConfig.create(name="y", spec="0 0 1 1 *", task_type="t", schedule_id=1)
    mgr = PeriodicTaskManager(
        StaticProvider([yearly]),
        MemoryTarget(),
        clock=clock,
        store=MemoryRuntimeStore(),
        signals=[SilentSignal()],
        timing=Timing(sync_interval=30, heartbeat_interval=5),
    )
    await mgr.start()
    try:
        await clock.advance(1.2)  # T0 + 2.5
        mgr.request_sync()  # an edit: sync at once
        await clock.advance(0)
        clock.deadlines.clear()
        await clock.advance(60)
        window = {d for d in clock.deadlines if d <= T0 + timedelta(seconds=62.5)}
        assert window == {T0 + timedelta(seconds=5 * k) for k in range(2, 13)}
        assert mgr.syncer.last_sync_at == T0 + timedelta(seconds=60)  # the tick, not 62.5
    finally:
        await mgr.stop()


class CountingStore:
    """A FailureStore that answers "no run yet" and counts the schedules it was asked about."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def failure_count(self, schedule_key: str, limit: int) -> FailureCount:
        self.asked.append(schedule_key)
        return FailureCount(0, None, [])

    async def save_failure_count(
        self, schedule_key: str, failures: int, checked_at: datetime
    ) -> None:
        raise AssertionError("nothing to save")

    async def reset_failure_count(self, schedule_key: str) -> None:
        raise AssertionError("nothing to reset")


class NeverAsked:
    """The target and the pauser of a watch that never gets that far."""

    def failure_off(self, options: Any) -> str | None:
        return None

    async def outcomes(self, options: Any, task_ids: Any) -> list[str]:
        raise AssertionError("no task to ask about")

    async def pause(self, key: str, note: str, manager_id: str) -> bool:
        raise AssertionError("nothing to pause")


async def test_the_failure_watch_walks_the_entries_again_only_after_they_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round every heartbeat interval looked at the options of every entry held (10,000 at
    rest: most of a round's cost); the entries with the option are found again only after an
    entry was registered or removed."""
    from periodic_manager.engine.scheduler import Scheduler
    from periodic_manager.runtime import failures as watch_module
    from periodic_manager.runtime.failures import FailureWatch

    looked: list[object] = []
    limit_of = watch_module.failures.limit_of

    def counting(options: Any) -> int | None:
        looked.append(options)
        return limit_of(options)

    monkeypatch.setattr(watch_module.failures, "limit_of", counting)
    clock = VirtualClock(T0)
    scheduler = Scheduler(MemoryTarget(), clock=clock)
    for i in range(1, 1001):
        scheduler.register(
            PeriodicTaskConfig.create(name=f"s{i}", spec="@hourly", task_type="t", schedule_id=i)
        )
    store, never = CountingStore(), NeverAsked()
    watch = FailureWatch(
        scheduler, store, never, never, clock=clock, manager_id="m", interval=5, paused=lambda: None
    )  # type: ignore[arg-type]
    for _ in range(3):
        assert await watch.round() == 0
    assert len(looked) == 1000 and store.asked == []  # one walk for three rounds
    scheduler.register(
        PeriodicTaskConfig.create(
            name="f",
            spec="@hourly",
            task_type="t",
            schedule_id=5000,
            options={"pause_after_failures": 3},
        )
    )
    looked.clear()
    for _ in range(3):
        await watch.round()
    assert len(looked) == 1001 + 3  # walked once again; then the watched one's limit at each check
    assert store.asked == ["5000"] * 3
    scheduler.unregister(5000)
    await watch.round()
    assert store.asked == ["5000"] * 3  # gone from the watch at once


class Broker:
    """A Forgetful target: notes when it is asked; down at first, then its data lost once."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.asked: list[datetime] = []
        self.sent: asyncio.Event | None = None  # set at every look: tasks are being sent

    async def forgotten(self) -> list[str]:
        self.asked.append(self.clock.now())
        if self.sent is not None:
            self.sent.set()
        if len(self.asked) == 1:
            from periodic_manager.errors import TargetError

            raise TargetError("down")
        return ["redis"] if len(self.asked) == 3 else []


async def test_the_broker_watch_looks_an_interval_after_the_start_then_on_the_ticks_while_sending() -> (
    None
):
    """A manager stopped within its first interval writes nothing to the broker (as before the
    ticks); a broker that cannot be asked is asked again at the next tick, not at once; while
    tasks are sent, it looks at every tick."""
    from periodic_manager.runtime.heartbeat import Heartbeat

    start = T0 + timedelta(seconds=1.3)
    clock = VirtualClock(start)
    lost: list[str] = []

    class Metrics:
        def broker_data_lost(self, name: str) -> None:
            lost.append(name)

    beat = Heartbeat(
        MemoryRuntimeStore(),
        "m",
        status=lambda: None,
        records=list,
        clock=clock,
        interval=5,  # type: ignore[arg-type, return-value]
        metrics=Metrics(),  # type: ignore[arg-type]
    )
    broker = Broker(clock)
    sent = asyncio.Event()
    broker.sent = sent  # a send between every two looks
    watching = asyncio.ensure_future(beat.watch(broker, sent))
    try:
        await clock.advance(4.9)
        assert broker.asked == []
        await clock.advance(20)
        assert broker.asked == [start + timedelta(seconds=5)] + [
            T0 + timedelta(seconds=s) for s in (10, 15, 20, 25)
        ]
        assert lost == ["redis"]
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)


async def test_the_broker_watch_of_a_manager_at_rest_looks_once_a_minute() -> None:
    """A round trip to the broker every 5 s bought nothing while nothing is sent: at rest the
    watch looks once a minute, and at the next tick after a send."""
    from periodic_manager.runtime.heartbeat import Heartbeat

    clock = VirtualClock(T0)

    class Metrics:
        def broker_data_lost(self, name: str) -> None:
            raise AssertionError("nothing lost")

    class Calm(Broker):
        async def forgotten(self) -> list[str]:
            self.asked.append(self.clock.now())
            return []

    beat = Heartbeat(
        MemoryRuntimeStore(),
        "m",
        status=lambda: None,
        records=list,
        clock=clock,
        interval=5,  # type: ignore[arg-type, return-value]
        metrics=Metrics(),  # type: ignore[arg-type]
    )
    broker = Calm(clock)
    sent = asyncio.Event()
    watching = asyncio.ensure_future(beat.watch(broker, sent))
    try:
        await clock.advance(5 * 60 + 1)
        assert broker.asked == [
            T0 + timedelta(seconds=s) for s in (5, 60, 120, 180, 240, 300)
        ]  # 61 before
        assert clock.next_deadline() == T0 + timedelta(seconds=360)  # no wake-up at the 5 s ticks
        broker.asked.clear()
        sent.set()  # a batch was sent
        await clock.advance(20)
        assert broker.asked == [T0 + timedelta(seconds=305)]  # the next tick; then at rest again
        assert clock.next_deadline() == T0 + timedelta(seconds=360)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)


async def test_the_command_looks_at_a_running_managers_health_four_times_a_minute() -> None:
    """``periodic-manager manager`` looks at the time-based reasons (thresholds of a minute and
    more) every 15 s, not at every 5 s tick; a loop that dies still wakes it at once."""
    from periodic_manager.cli.main import _supervise

    clock = Recording(T0)
    looks: list[datetime] = []

    class Tasks:
        died = asyncio.Event()

    class Stub:
        def __init__(self) -> None:
            self.clock = clock
            self.tasks = Tasks()

        async def start(self) -> None:
            return None

        async def stop(self) -> None:
            return None

        def health(self) -> str | None:
            looks.append(clock.now())
            return "a loop died" if Tasks.died.is_set() else None

    supervising = asyncio.ensure_future(_supervise(Stub(), None))
    try:
        await clock.advance(60)
        assert looks == [T0 + timedelta(seconds=s) for s in (0, 15, 30, 45, 60)]
        Tasks.died.set()
        await clock.advance(0)
        assert await asyncio.wait_for(supervising, 5) == 1 and looks[-1] == T0 + timedelta(
            seconds=60
        )
    finally:
        supervising.cancel()
        await asyncio.gather(supervising, return_exceptions=True)
