"""What an edit, a takeover, a catch-up and a dying loop may and may not do to the schedule
(virtual clock, memory target and store; the database variants live beside the faults tests).

Each test is named after the guarantee it proves.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import RunRecord, StateRecord
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.providers import StaticProvider
from periodic_manager.runtime.leading import SETTLED_RETRY_S, SETTLED_STALL_S
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.runtime.memory_store import MemoryRuntimeStore
from periodic_manager.runtime.timing import Timing
from periodic_manager.schedules.definition import UNKNOWN_START, PeriodicTaskConfig
from periodic_manager.targets.memory import MemoryTarget
from tests.support.managers import ManualLeader, settle

T0 = datetime(2024, 5, 1, 12, 0, 0, 500000, tzinfo=UTC)  # half a second past a minute


def row(i: int, name: str, spec: str = "@every 1s", **kw: object) -> PeriodicTaskConfig:
    return PeriodicTaskConfig.create(name=name, spec=spec, task_type="t", schedule_id=i, **kw)  # type: ignore[arg-type]


async def manager(
    provider: StaticProvider,
    clock: VirtualClock,
    target: MemoryTarget,
    store: MemoryRuntimeStore | None = None,
    *,
    leader: bool = True,
) -> PeriodicTaskManager:
    mgr = PeriodicTaskManager(
        provider,
        target,
        clock=clock,
        store=store or MemoryRuntimeStore(),
        timing=Timing(grace=30, sync_interval=3600, catchup_window=3600),
        leadership=ManualLeader(leader),
    )
    await mgr.start()
    await clock.settle()
    return mgr


def seconds(*offsets: float) -> list[datetime]:
    base = T0.replace(microsecond=0)
    return [base + timedelta(seconds=s) for s in offsets]


# -- edits ------------------------------------------------------------------------------------


async def test_a_payload_edit_while_a_slot_is_due_keeps_that_slot_every_time() -> None:
    """The issue's storm: an @every 1s row edited between every slot and its dispatch. Before,
    each replacement restarted after now and dropped the due slot."""
    clock, target = VirtualClock(T0), MemoryTarget()
    provider = StaticProvider([row(1, "edited", payload={"v": 0})])
    mgr = await manager(provider, clock, target)
    try:
        for n in range(1, 31):
            clock.set(T0.replace(microsecond=0) + timedelta(seconds=n, milliseconds=1))  # due
            provider.configs = [row(1, "edited", payload={"v": n})]
            await mgr.sync()  # applied before the scheduler woke for the slot
            await settle(clock, mgr)
        assert target.slots("edited") == seconds(*range(1, 31))  # every slot, once
        assert [t.payload for t, _ in target.messages] == [{"v": n} for n in range(1, 31)]
    finally:
        await mgr.stop()


async def test_a_timing_edit_sends_the_due_slot_of_the_old_timing_and_nothing_before_the_edit() -> (
    None
):
    clock, target = VirtualClock(T0), MemoryTarget()
    provider = StaticProvider([row(1, "retimed", "@every 10s")])
    mgr = await manager(provider, clock, target)
    try:
        await clock.advance(9.5, settle=lambda: mgr.wait_settled(clock.now()))  # 12:00:10 sent
        clock.set(T0 + timedelta(seconds=20))  # 12:00:20 is due, not yet sent
        provider.configs = [row(1, "retimed", "@every 7s")]
        await mgr.sync()
        await clock.advance(30, settle=lambda: mgr.wait_settled(clock.now()))
        # 12:00:20 was due under the old timing: sent. The new timing starts strictly after the
        # edit (12:00:20.5); its slot just before the edit is never sent.
        edit = T0 + timedelta(seconds=20)
        new = row(1, "retimed", "@every 7s").schedule
        before_edit = [s for s in new.next_fires(edit - timedelta(seconds=7), 1) if s <= edit]
        sent = target.slots("retimed")
        assert sent[:2] == seconds(10, 20)
        assert sent[2:] == new.next_fires(edit, len(sent) - 2)
        assert before_edit and before_edit[0] not in sent
        assert len(sent) == len(set(sent))
    finally:
        await mgr.stop()


async def test_a_rename_is_applied_and_its_keys_change_from_the_next_slot() -> None:
    """Name is part of the idempotency key: a rename with the same content is still applied."""
    clock, target = VirtualClock(T0), MemoryTarget()
    provider = StaticProvider([row(1, "old.name", "@every 10s")])
    mgr = await manager(provider, clock, target)
    try:
        await clock.advance(10, settle=lambda: mgr.wait_settled(clock.now()))
        provider.configs = [row(1, "new.name", "@every 10s")]
        await mgr.sync()
        await clock.advance(10, settle=lambda: mgr.wait_settled(clock.now()))
        assert target.slots("old.name") == seconds(10)
        assert target.slots("new.name") == seconds(20)
    finally:
        await mgr.stop()


# -- takeovers and catch-up never reach before effective_at -----------------------------------


async def test_a_takeover_never_sends_a_slot_from_before_the_schedule_existed() -> None:
    """The issue's reproduction: a schedule created 5 s before the leader died. The standby
    re-sends the last grace (30 s) of slots, but none at or before the schedule's creation."""
    clock, target, store = VirtualClock(T0), MemoryTarget(), MemoryRuntimeStore()
    created = T0 + timedelta(seconds=55)
    old = row(1, "old", effective_at=T0 - timedelta(days=1))
    provider = StaticProvider([old])
    leader = await manager(provider, clock, target, store)
    standby: PeriodicTaskManager | None = None
    try:
        standby = await manager(provider, clock, target, store, leader=False)
        await clock.advance(55, settle=lambda: leader.wait_settled(clock.now()))
        provider.configs = [old, row(2, "new", effective_at=created)]
        for m in (leader, standby):
            await m.sync()
        await clock.advance(5, settle=lambda: leader.wait_settled(clock.now()))
        await leader.stop()  # dies at 12:01:00.5
        await clock.advance(10)  # nobody leads for 10 s
        await standby.leadership._set(True)  # type: ignore[attr-defined]
        await settle(clock, standby)
        new = target.slots("new")
        assert new and min(new) > created  # nothing from before it existed
        assert new == seconds(*range(56, 71))  # everything after it, once
        old_slots = target.slots("old")
        assert old_slots == seconds(*range(1, 71))  # the old one: the gap re-sent, nothing twice
    finally:
        if standby is not None:
            await standby.stop()
        await leader.stop()  # if an assert came before its stop (a second stop does nothing)


async def test_a_takeover_never_sends_the_old_timing_or_a_slot_from_while_it_was_paused() -> None:
    clock, target, store = VirtualClock(T0), MemoryTarget(), MemoryRuntimeStore()
    resumed = T0 + timedelta(seconds=20)
    provider = StaticProvider([row(1, "resumed", "@every 1s", effective_at=resumed)])
    standby = await manager(provider, clock, target, store, leader=False)
    try:
        await clock.advance(25)
        await standby.leadership._set(True)  # type: ignore[attr-defined]
        await settle(clock, standby)
        assert target.slots("resumed") == seconds(*range(21, 26))
    finally:
        await standby.stop()


async def test_an_unknown_effective_at_means_nothing_in_the_past_is_sent() -> None:
    clock, target = VirtualClock(T0), MemoryTarget()
    provider = StaticProvider(
        [
            row(
                1,
                "unknown",
                "* * * * *",
                effective_at=UNKNOWN_START,
                options={"misfire": "fire_once"},
            )
        ]
    )
    mgr = await manager(provider, clock, target)
    try:
        await settle(clock, mgr)
        assert target.slots("unknown") == []  # 12:00 is in the past: not caught up
        await clock.advance(60, settle=lambda: mgr.wait_settled(clock.now()))
        assert target.slots("unknown") == [datetime(2024, 5, 1, 12, 1, tzinfo=UTC)]
    finally:
        await mgr.stop()


async def test_fire_once_catch_up_never_sends_a_slot_from_before_the_schedule_existed() -> None:
    clock, target, store = (
        VirtualClock(T0 + timedelta(minutes=50)),
        MemoryTarget(),
        MemoryRuntimeStore(),
    )
    provider = StaticProvider(
        [
            # Hourly; created at 12:30, after its 12:00 slot: nothing to catch up at 12:50.
            row(
                1,
                "young",
                "0 * * * *",
                options={"misfire": "fire_once"},
                effective_at=T0 + timedelta(minutes=30),
            ),
            # Created at 11:30: 12:00 was missed and is caught up once.
            row(
                2,
                "older",
                "0 * * * *",
                options={"misfire": "fire_once"},
                effective_at=T0 - timedelta(minutes=30),
            ),
        ]
    )
    mgr = await manager(provider, clock, target, store)
    try:
        await settle(clock, mgr)
        assert target.slots("young") == []
        assert target.slots("older") == [datetime(2024, 5, 1, 12, 0, tzinfo=UTC)]
    finally:
        await mgr.stop()


# -- one entry never stops the others ----------------------------------------------------------


async def test_an_entry_with_no_slot_left_stops_alone_and_says_why() -> None:
    start = datetime(9999, 12, 31, 23, 59, 50, tzinfo=UTC)
    clock, target = VirtualClock(start), MemoryTarget()
    sched = Scheduler(target, clock=clock, grace=30)
    task = asyncio.create_task(sched.run())
    try:
        yearly = sched.register(row(1, "yearly", "0 0 1 1 *"))  # the next is in year 10000
        every = sched.register(row(2, "every", "@every 1s"))
        assert yearly.next_slot is None and "no slot" in (yearly.last_error or "")
        await clock.advance(9, settle=lambda: sched.wait_processed(clock.now()))
        # Slots up to the last second of 9999 go out (their expiry saturates, no overflow).
        assert len(target.slots("every")) == 9
        assert every.next_slot is None and "no slot" in (every.last_error or "")
    finally:
        sched.stop()
        await asyncio.wait_for(task, 5)


async def test_a_huge_catchup_window_built_without_validation_cannot_overflow_a_slot() -> None:
    clock, target = VirtualClock(T0), MemoryTarget()
    sched = Scheduler(target, clock=clock, grace=30)
    cfg = PeriodicTaskConfig(
        name="huge",
        spec="@every 1s",
        task_type="t",
        options={"misfire": "fire_once", "catchup_window": 1e12},
    )
    task = asyncio.create_task(sched.run())
    try:
        sched.register(cfg)
        await clock.advance(3, settle=lambda: sched.wait_processed(clock.now()))
        assert len(target.slots("huge")) == 3
    finally:
        sched.stop()
        await asyncio.wait_for(task, 5)


# -- a dead loop is never silent ----------------------------------------------------------------


async def test_a_dead_sync_loop_makes_the_manager_unhealthy_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, target = VirtualClock(T0), MemoryTarget()
    mgr = await manager(StaticProvider([row(1, "a")]), clock, target)
    try:
        assert mgr.health() is None

        async def broken(*, full: bool = False) -> None:
            raise RuntimeError("injected")

        mgr.syncer._sync = broken  # type: ignore[method-assign]
        caplog.set_level(logging.CRITICAL, "periodic_manager")
        mgr.request_sync()
        await clock.settle()
        assert mgr.health() == "periodic-manager-sync-loop died: RuntimeError: injected"
        lines = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
        assert lines == ["periodic-manager-sync-loop died: RuntimeError: injected"]
    finally:
        await mgr.stop()


async def test_a_dead_leadership_loop_is_a_dead_manager() -> None:
    class DyingLeader(ManualLeader):
        task: asyncio.Task[None] | None = None

        async def start(self, on_change: Any) -> None:
            await super().start(on_change)

            async def loop() -> None:
                await asyncio.sleep(0)
                raise ConnectionError("leadership loop broke")

            self.task = asyncio.ensure_future(loop())
            self.task.set_name("periodic-manager-leadership")

    clock = VirtualClock(T0)
    mgr = PeriodicTaskManager(
        StaticProvider([row(1, "a")]), MemoryTarget(), clock=clock, leadership=DyingLeader(True)
    )
    await mgr.start()
    try:
        for _ in range(5):
            await asyncio.sleep(0)
        assert (
            mgr.health()
            == "periodic-manager-leadership died: ConnectionError: leadership loop broke"
        )
    finally:
        await mgr.stop()


async def test_a_dispatch_that_never_returns_is_reported_as_hung() -> None:
    class NeverAnswers(MemoryTarget):
        async def enqueue(self, tasks, now):  # type: ignore[no-untyped-def]
            await asyncio.Event().wait()

    clock = VirtualClock(T0)
    mgr = PeriodicTaskManager(StaticProvider([row(1, "a")]), NeverAnswers(), clock=clock)
    await mgr.start()
    try:
        await clock.advance(1)
        assert mgr.health() is None  # just started sending
        clock.set(T0 + timedelta(seconds=200))
        assert "no progress" in (mgr.health() or "")
    finally:
        mgr.scheduler.stop()
        await mgr.tasks.stop()
        await mgr.stop()


# -- history waits for the store ----------------------------------------------------------------


class FlakyStore(MemoryRuntimeStore):
    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.attempts = 0

    async def record_runs(self, runs: object) -> None:
        self.attempts += 1
        if self.down:
            raise ConnectionError("database unreachable")
        await super().record_runs(runs)  # type: ignore[arg-type]


async def test_history_of_an_outage_is_recorded_in_order_when_the_store_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, target, store = VirtualClock(T0), MemoryTarget(), FlakyStore()
    mgr = await manager(StaticProvider([row(1, "a")]), clock, target, store)
    caplog.set_level(logging.WARNING, "periodic_manager")
    try:
        store.down = True
        for _ in range(60):  # a minute of outage, one slot a second
            await clock.advance(1, settle=lambda: mgr.wait_settled(clock.now()))
        assert store.runs == [] and store.attempts < 20  # retried with backoff, not per slot
        store.down = False
        await clock.advance(31, settle=lambda: mgr.wait_settled(clock.now()))
        slots = [r.slot for r in store.runs]
        assert slots == seconds(*range(1, 92))  # every run, in order, none lost
        messages = [r.getMessage() for r in caplog.records]
        assert sum(m.startswith("recording run history failed") for m in messages) == 1
        assert sum(m.startswith("run history recorded again") for m in messages) == 1
        assert any("0 dropped" in m for m in messages)
    finally:
        await mgr.stop()


async def test_history_buffer_is_bounded_and_says_what_it_dropped(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("periodic_manager.engine.history.MAX_PENDING_RUNS", 10)
    clock, target, store = VirtualClock(T0), MemoryTarget(), FlakyStore()
    mgr = await manager(StaticProvider([row(1, "a")]), clock, target, store)
    caplog.set_level(logging.WARNING, "periodic_manager")
    try:
        store.down = True
        for _ in range(25):
            await clock.advance(1, settle=lambda: mgr.wait_settled(clock.now()))
        store.down = False
        await clock.advance(31, settle=lambda: mgr.wait_settled(clock.now()))
        recorded = [r.slot for r in store.runs]
        lines = [r.getMessage() for r in caplog.records if "dropped while" in r.getMessage()]
        assert len(lines) == 1
        dropped = int(lines[0].split(" dropped")[0].rsplit(" ", 1)[1])
        assert dropped >= 15  # 25 runs of outage, 10 kept
        assert recorded == seconds(*range(1 + dropped, 57))  # the newest kept, in order
        assert target.slots("a") == seconds(*range(1, 57))  # sending never depended on it
    finally:
        await mgr.stop()


async def test_a_burst_larger_than_the_outage_buffer_is_recorded_whole_by_a_healthy_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The buffer bound is for outages only: 25 schedules due at one instant with a bound of 10
    are all recorded (before, a burst over 100,000 tasks lost the settled slot of the rest)."""
    monkeypatch.setattr("periodic_manager.engine.history.MAX_PENDING_RUNS", 10)
    clock, target, store = VirtualClock(T0), MemoryTarget(), FlakyStore()
    mgr = await manager(
        StaticProvider([row(i, f"b{i}") for i in range(1, 26)]), clock, target, store
    )
    try:
        await clock.advance(1, settle=lambda: mgr.wait_settled(clock.now()))
        assert len(target.messages) == 25
        assert sorted(r.name for r in store.runs) == sorted(f"b{i}" for i in range(1, 26))
    finally:
        await mgr.stop()


def test_runs_are_counted_once_even_when_their_recording_is_retried() -> None:
    """Metrics observe a run when it happens, not when the store finally takes it."""
    seen: list[RunRecord] = []

    async def scenario() -> None:
        sched = Scheduler(MemoryTarget(), observe=seen.extend, on_runs=None)
        sched.writer.report([run])

    run = RunRecord("1", "a", T0, "enqueued", T0)
    asyncio.run(scenario())
    assert seen == [run]


# -- a takeover trusts what the store records as settled, not only the broker's claims ----------


async def test_a_takeover_after_the_broker_forgot_its_claims_sends_no_settled_slot_again() -> None:
    """The issue's reproduction: the broker restarted without persistence (every claim gone),
    then a takeover a second later. Before, the new leader re-sent every slot of the last grace;
    the store records each schedule's latest settled slot, and the takeover starts after it."""
    clock, target, store = VirtualClock(T0), MemoryTarget(), MemoryRuntimeStore()
    provider = StaticProvider(
        [row(i, f"s{i}", effective_at=T0 - timedelta(days=1)) for i in range(1, 201)]
    )
    leader = await manager(provider, clock, target, store)
    standby: PeriodicTaskManager | None = None
    try:
        standby = await manager(provider, clock, target, store, leader=False)
        await clock.advance(20, settle=lambda: leader.wait_settled(clock.now()))
        await leader.stop()  # at 12:00:20.5: the store holds slot :20 of every schedule
        target.forget()
        await clock.advance(1)
        await standby.leadership._set(True)  # type: ignore[attr-defined]
        await clock.advance(5, settle=lambda: standby.wait_settled(clock.now()))
        for i in (1, 100, 200):
            assert target.slots(f"s{i}") == seconds(*range(1, 27))  # once each, none lost
        assert len(target.messages) == 200 * 26
        assert standby.scheduler.counts["duplicate"] == 0
    finally:
        if standby is not None:
            await standby.stop()
        await leader.stop()  # if an assert came before its stop (a second stop does nothing)


async def test_a_takeover_still_sends_a_slot_the_old_leader_failed_or_never_recorded() -> None:
    """Only settled slots are skipped: a slot the old leader failed (its broker was down) is
    sent by the new leader while it is within grace, and so is every slot after the last one
    the store recorded."""
    clock, target, store = VirtualClock(T0), MemoryTarget(), MemoryRuntimeStore()
    provider = StaticProvider([row(1, "s1", effective_at=T0 - timedelta(days=1))])
    leader = await manager(provider, clock, target, store)
    standby: PeriodicTaskManager | None = None
    try:
        standby = await manager(provider, clock, target, store, leader=False)
        await clock.advance(10, settle=lambda: leader.wait_settled(clock.now()))
        target.fail_with = "broker down"
        await clock.advance(3)  # slots :11-:13 fail while the leader retries
        await leader.stop()
        target.fail_with = None
        await standby.leadership._set(True)  # type: ignore[attr-defined]
        await clock.advance(1, settle=lambda: standby.wait_settled(clock.now()))
        assert target.slots("s1") == seconds(*range(1, 15))
        assert store.state["1"].last_done_at == seconds(14)[0]
    finally:
        if standby is not None:
            await standby.stop()
        await leader.stop()  # if an assert came before its stop (a second stop does nothing)


async def test_a_settled_slot_from_the_future_only_stops_the_look_back() -> None:
    """The store is data like any other: a settled slot in the future (another clock, a
    hand-written row) must not stop the schedule; it only means nothing in the past is sent."""
    clock, target, store = VirtualClock(T0), MemoryTarget(), MemoryRuntimeStore()
    provider = StaticProvider([row(1, "s1", effective_at=T0 - timedelta(days=1))])
    store.state["1"] = StateRecord("1", "s1", last_done_at=T0 + timedelta(days=365))
    standby = await manager(provider, clock, target, store, leader=False)
    try:
        await clock.advance(10)
        await standby.leadership._set(True)  # type: ignore[attr-defined]
        await clock.advance(3, settle=lambda: standby.wait_settled(clock.now()))
        assert target.slots("s1") == seconds(11, 12, 13)
    finally:
        await standby.stop()


async def test_a_takeover_waits_for_the_settled_slots_and_sends_nothing_meanwhile(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Flaky(MemoryRuntimeStore):
        failures = 3

        async def settled_after(self, since: datetime) -> dict[str, datetime]:
            if self.failures:
                self.failures -= 1
                raise ConnectionError("database unreachable")
            return await super().settled_after(since)

    clock, target, store = VirtualClock(T0), MemoryTarget(), Flaky()
    provider = StaticProvider([row(1, "s1", effective_at=T0 - timedelta(days=1))])
    leader = await manager(provider, clock, target, store)
    standby: PeriodicTaskManager | None = None
    try:
        standby = await manager(provider, clock, target, store, leader=False)
        await clock.advance(10, settle=lambda: leader.wait_settled(clock.now()))
        await leader.stop()
        target.forget()
        await standby.leadership._set(True)  # type: ignore[attr-defined]
        await clock.advance(1)
        assert target.slots("s1") == seconds(*range(1, 11))  # nothing while the read fails
        await clock.advance(5, settle=lambda: standby.wait_settled(clock.now()))
        assert target.slots("s1") == seconds(*range(1, 17))  # then the gap, once
        waits = [r for r in caplog.records if "takeover waits" in r.getMessage()]
        assert len(waits) == 1  # one line for the outage, not one per retry
    finally:
        if standby is not None:
            await standby.stop()
        await leader.stop()  # if an assert came before its stop (a second stop does nothing)


async def test_a_takeover_that_cannot_read_the_settled_slots_for_long_makes_the_manager_unhealthy() -> (
    None
):
    """Nothing is sent while the settled slots are unknown; a read that keeps failing must not
    leave a leader that sends nothing looking healthy: after SETTLED_STALL_S the probe fails."""

    class Down(MemoryRuntimeStore):
        down = True

        async def settled_after(self, since: datetime) -> dict[str, datetime]:
            if self.down:
                raise ConnectionError("database unreachable")
            return await super().settled_after(since)

    clock, target, store = VirtualClock(T0), MemoryTarget(), Down()
    provider = StaticProvider([row(1, "s1", effective_at=T0 - timedelta(days=1))])
    standby = await manager(provider, clock, target, store, leader=False)
    try:
        await standby.leadership._set(True)  # type: ignore[attr-defined]
        await clock.advance(SETTLED_STALL_S - 1)
        assert standby.health() is None
        await clock.advance(2)
        reason = standby.health() or ""
        assert reason.startswith("takeover cannot read the settled slots for ")
        assert "ConnectionError: database unreachable" in reason
        assert target.messages == []
        store.down = False
        await clock.advance(1, settle=lambda: standby.wait_settled(clock.now()))
        assert standby.health() is None
        assert target.slots("s1")  # sending resumed
    finally:
        await standby.stop()


async def test_a_takeover_looks_back_from_when_the_settled_slots_were_read() -> None:
    """A read retried past grace: the look back starts from the read that succeeded. Measured
    from the change of leadership instead, a fire_once slot still within grace then was left to
    the normal path, which found it late by the time it could send and skipped it: the latest
    missed slot, lost although within the schedule's catch-up window."""

    class Slow(MemoryRuntimeStore):
        failures = 30
        sinces: list[datetime] = []

        async def settled_after(self, since: datetime) -> dict[str, datetime]:
            if self.failures:
                self.failures -= 1
                raise ConnectionError("database unreachable")
            self.sinces.append(since)
            return await super().settled_after(since)

    clock, target, store = VirtualClock(T0), MemoryTarget(), Slow()
    opts = {"misfire": "fire_once"}
    provider = StaticProvider(
        [row(1, "s1", spec="@every 60s", effective_at=T0 - timedelta(days=1), options=opts)]
    )
    leader = await manager(provider, clock, target, store)
    standby = await manager(provider, clock, target, store, leader=False)
    try:
        await clock.advance(110, settle=lambda: leader.wait_settled(clock.now()))
        await leader.stop()  # at 12:01:50.5: 12:00 (its own catch-up) and 12:01 settled
        await clock.advance(20)
        await standby.leadership._set(True)  # at 12:02:10.5: slot 12:02 is 10.5 s late
        await clock.advance(30)  # the read succeeds at 12:02:40.5: slot 12:02 is now beyond grace
        await settle(clock, standby)
        assert store.sinces == [T0 + timedelta(seconds=160 - 30)]
        assert target.slots("s1") == seconds(0, 60, 120)  # 12:02 caught up once
        assert standby.scheduler.counts["skipped"] == 0
    finally:
        await standby.stop()
        await leader.stop()  # if an assert came before its stop (a second stop does nothing)


async def test_settling_a_manager_waits_for_its_takeovers_read_but_not_for_its_retries() -> None:
    """A takeover's read of the settled slots takes real time (a database), not the virtual
    clock's: a test that settles a manager and then moves the clock must not move it while the
    read is still in flight (the slots due meanwhile would be found late and skipped; it made
    test_max_runs_manager fail under load). A read that failed and waits on the clock to retry
    must not hold the settling up (the clock would never move)."""

    class Gated(MemoryRuntimeStore):
        failing = False

        def __init__(self) -> None:
            super().__init__()
            self.gate = asyncio.Event()

        async def settled_after(self, since: datetime) -> dict[str, datetime]:
            if self.failing:
                raise ConnectionError("database unreachable")
            await self.gate.wait()
            return await super().settled_after(since)

    clock, target, store = VirtualClock(T0), MemoryTarget(), Gated()
    provider = StaticProvider([row(1, "s1", effective_at=T0 - timedelta(days=1))])
    standby = await manager(provider, clock, target, store, leader=False)
    try:
        await standby.leadership._set(True)  # type: ignore[attr-defined]
        settling = asyncio.ensure_future(settle(clock, standby))
        for _ in range(1000):  # far more turns of the loop than settling takes (about 100)
            await asyncio.sleep(0)
        assert not settling.done()  # the read is in flight
        store.gate.set()
        await asyncio.wait_for(settling, 5)
        assert standby.scheduler.active
        await clock.advance(1, settle=lambda: standby.wait_settled(clock.now()))
        assert target.slots("s1")[-1] == seconds(1)[0]  # due since, sent on time

        # A read that fails waits on the clock: settling goes on, and the clock can move.
        await standby.leadership._set(False)  # type: ignore[attr-defined]
        store.failing = True
        await standby.leadership._set(True)  # type: ignore[attr-defined]
        await asyncio.wait_for(settle(clock, standby), 5)
        store.failing = False
        await asyncio.wait_for(
            clock.advance(SETTLED_RETRY_S, settle=lambda: standby.wait_settled(clock.now())), 5
        )
        assert standby.scheduler.active
    finally:
        await standby.stop()
