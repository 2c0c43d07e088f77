"""options.jitter in the engine (virtual clock, in-memory target): each slot is sent at slot +
an offset in [0, jitter), derived from the slot's idempotency key, so every scheduler computes
the same one; the task keeps the nominal slot (scheduled_at, idempotency key); lateness and
expiry are measured from the send instant; schedules without jitter never touch the send table."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from periodic_manager.clock import VirtualClock
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.errors import ConfigError
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.instants import slot_text
from periodic_manager.schedules.jitter import offset_us, send_at
from periodic_manager.schedules.judge import shortest_gap
from periodic_manager.targets.memory import MemoryTarget

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
US = timedelta(microseconds=1)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def cfg(name: str, spec: str, i: int | None = None, **options: object) -> PeriodicTaskConfig:
    return PeriodicTaskConfig.create(
        name=name, spec=spec, task_type="demo.task", options=options, schedule_id=i
    )


async def running(
    clock: VirtualClock, target: MemoryTarget, grace: float = 30
) -> tuple[Scheduler, asyncio.Task[None]]:
    sched = Scheduler(target, clock=clock, grace=grace)
    task = asyncio.create_task(sched.run())
    await clock.settle()
    return sched, task


@pytest.fixture
async def rig() -> AsyncIterator[tuple[Scheduler, VirtualClock, MemoryTarget]]:
    clock = VirtualClock(T0)
    target = MemoryTarget()
    sched, task = await running(clock, target)
    yield sched, clock, target
    sched.stop()
    await asyncio.wait_for(task, 5)


async def advance(sched: Scheduler, clock: VirtualClock, seconds: float) -> None:
    await clock.advance(seconds, settle=lambda: sched.wait_processed(clock.now()))


def test_offsets_are_deterministic_and_within_the_window() -> None:
    jitter_us = 60_000_000
    seen = set()
    for i in range(2000):
        key = f"s{i}:{slot_text(T0)}"
        off = offset_us(key, jitter_us)
        assert 0 <= off < jitter_us
        assert off == offset_us(key, jitter_us)  # a pure function of the key
        seen.add(off)
    assert len(seen) > 1990  # spread, not clustered
    assert offset_us("a:x", 1) == 0 and offset_us("a:x", 0) == 0
    # Another slot of the same schedule gets another offset.
    assert send_at("a", T0, jitter_us) - T0 != send_at("a", at(3600), jitter_us) - at(3600)


async def test_a_slot_is_sent_at_its_send_instant_with_the_nominal_slot(rig) -> None:
    sched, clock, target = rig
    entry = sched.register(cfg("a", "@every 60s", jitter=30))
    assert entry.next_slot == at(60)  # the entry's slot stays nominal (previews, publishing)
    send = send_at("a", at(60), 30_000_000)
    assert at(60) <= send < at(90)
    await advance(sched, clock, (send - T0 - US).total_seconds())
    assert target.messages == []  # not before its send instant
    await advance(sched, clock, 1e-6)
    ((task, sent),) = target.messages
    assert sent == send
    assert task.scheduled_at == at(60)
    assert task.idempotency_key == f"a:{slot_text(at(60))}"
    assert task.expires_at >= send + timedelta(seconds=30)  # expiry measured from the send
    assert entry.next_slot == at(120) and entry.prev_slot == at(60) and entry.fired == at(60)
    await advance(sched, clock, 300)
    due = [at(s) for s in range(60, 600, 60) if send_at("a", at(s), 30_000_000) <= clock.now()]
    assert target.slots("a") == due and len(due) >= 5
    assert [sent for _, sent in target.messages] == [send_at("a", s, 30_000_000) for s in due]
    assert sched.counts["skipped"] == 0


async def test_a_jittered_send_later_than_grace_is_not_late() -> None:
    clock, target = VirtualClock(T0), MemoryTarget()
    sched, task = await running(clock, target, grace=1)
    try:
        for i in range(50):
            sched.register(cfg(f"h{i}", "@hourly", i, jitter=3000))
        await advance(sched, clock, 3 * 3600)
        assert sched.counts["skipped"] == 0
        assert len(target.messages) == 100
        sent_offsets = [(sent - t.scheduled_at).total_seconds() for t, sent in target.messages]
        assert max(sent_offsets) > 1  # most are far beyond grace after their slot
        assert all(0 <= o < 3000 for o in sent_offsets)
    finally:
        sched.stop()
        await asyncio.wait_for(task, 5)


async def test_a_thousand_hourly_schedules_spread_over_the_window(rig) -> None:
    sched, clock, target = rig
    for i in range(1000):
        sched.register(cfg(f"hourly.{i}", "@hourly", i, jitter=60))
    assert len(sched.registered.timetable) == 0
    assert len(sched.registered.sends) > 990  # ~1000 distinct send instants, not one
    await advance(sched, clock, 3600 + 60)
    slot = T0 + timedelta(hours=1)
    assert len(target.messages) == 1000
    assert {t.scheduled_at for t, _ in target.messages} == {slot}
    assert {t.idempotency_key for t, _ in target.messages} == {
        f"hourly.{i}:{slot_text(slot)}" for i in range(1000)
    }
    sends = sorted(sent for _, sent in target.messages)
    assert slot <= sends[0] and sends[-1] < slot + timedelta(seconds=60)
    assert sends[-1] - sends[0] > timedelta(seconds=55)
    assert len(target.batches) > 990  # one small batch per send instant
    per_10s = [
        sum(1 for s in sends if slot + timedelta(seconds=k) <= s < slot + timedelta(seconds=k + 10))
        for k in range(0, 60, 10)
    ]
    assert all(100 < n < 240 for n in per_10s), per_10s


async def test_two_schedulers_send_each_slot_at_the_same_instant() -> None:
    clock = VirtualClock(T0)
    targets = [MemoryTarget(), MemoryTarget()]
    rigs = [await running(clock, t) for t in targets]
    try:
        for sched, _ in rigs:
            for i in range(20):
                sched.register(cfg(f"s{i}", "*/5 * * * *", i, jitter=120))
        await clock.advance(
            1020, settle=lambda: asyncio.gather(*(s.wait_processed(clock.now()) for s, _ in rigs))
        )
        a = sorted((t.idempotency_key, sent) for t, sent in targets[0].messages)
        b = sorted((t.idempotency_key, sent) for t, sent in targets[1].messages)
        assert len(a) == 60 and a == b
    finally:
        for sched, task in rigs:
            sched.stop()
            await asyncio.wait_for(task, 5)


async def test_without_jitter_the_send_table_stays_empty(rig) -> None:
    sched, clock, target = rig
    entry = sched.register(cfg("plain", "@every 10s"))
    assert len(sched.registered.sends) == 0 and len(sched.registered.timetable) == 1
    await advance(sched, clock, 30)
    assert [sent for _, sent in target.messages] == [at(10), at(20), at(30)]
    assert target.slots("plain") == [at(10), at(20), at(30)]
    assert entry.next_slot == at(40)


async def test_replaced_by_a_jittered_version_keeps_its_slot_and_moves_table(rig) -> None:
    sched, clock, target = rig
    sched.register(cfg("a", "@every 60s", 1))
    entry = sched.register(cfg("a", "@every 60s", 1, jitter=10))
    assert entry.next_slot == at(60)
    await advance(sched, clock, 130)
    assert target.slots("a") == [at(60), at(120)]  # once each, from the send table
    sched.register(cfg("a", "@every 60s", 1))  # jitter removed: back on the timetable
    await advance(sched, clock, 60)
    assert target.slots("a") == [at(60), at(120), at(180)]
    assert target.messages[-1][1] == at(180)


async def test_rebase_looks_back_in_nominal_slots(rig) -> None:
    sched, clock, target = rig
    sched.register(cfg("a", "@every 60s", 1, jitter=50))
    await advance(sched, clock, 61 + 50)
    sent_first = len(target.messages)
    sched.set_active(False)
    await sched.rebase(clock.now() - timedelta(seconds=30), {1: at(60)})
    sched.set_active(True)
    await advance(sched, clock, 200)
    assert target.slots("a") == [at(s) for s in (60, 120, 180, 240, 300)][: len(target.slots("a"))]
    assert sent_first == 1 and len(set(target.slots("a"))) == len(target.slots("a"))


def test_validation_names_options_jitter() -> None:
    ok = cfg("a", "@hourly", jitter=3599.5)
    assert ok.options["jitter"] == 3599.5
    cfg("b", "@every 90s", jitter=89)
    for spec, value, why in (
        ("@hourly", True, "number"),
        ("@hourly", "10", "number"),
        ("@hourly", 0, "> 0"),
        ("@hourly", -1, "> 0"),
        ("@hourly", float("nan"), "number"),
        ("@hourly", float("inf"), "number"),
        ("@hourly", 10**400, "at most"),
        ("@hourly", 3600, "shortest gap"),
        ("@every 90s", 90, "shortest gap"),
        ("* * * * *", 60, "between slots (60 s)"),
        ("0 9 * * 1-5", 86400, "between slots (86400 s)"),
    ):
        with pytest.raises(ConfigError) as err:
            cfg("a", spec, jitter=value)
        assert err.value.field == "options.jitter"
        assert why in err.value.reason


def test_shortest_gap() -> None:
    assert shortest_gap(cfg("a", "@every 90s").schedule) == timedelta(seconds=90)
    assert shortest_gap(cfg("a", "0,10 * * * *").schedule) == timedelta(minutes=10)
    assert shortest_gap(cfg("a", "@daily").schedule) == timedelta(days=1)


async def test_a_takeover_sends_a_slot_whose_send_instant_has_not_come(rig) -> None:
    """The old leader died after the slot but before its send instant: the takeover's look-back
    (now - grace) is after the slot, yet the slot is sent, at its send instant, once."""
    sched, clock, target = rig
    name, jitter_us = next(
        (n, 50_000_000)
        for n in (f"j{i}" for i in range(1000))
        if send_at(n, at(60), 50_000_000) - at(60) > timedelta(seconds=40)
    )  # a schedule whose 12:01 slot is sent more than 40 s after it
    sched.register(cfg(name, "@every 60s", 1, jitter=50))
    sched.set_active(False)  # the leader is gone before the slot
    await advance(sched, clock, 60 + 35)  # 12:01:35: the slot is 35 s old, not sent yet
    assert target.messages == []
    await sched.rebase(clock.now() - timedelta(seconds=30), {})  # looks back to 12:01:05
    sched.set_active(True)
    await advance(sched, clock, 30)
    assert target.slots(name) == [at(60)]
    assert target.messages[0][1] == send_at(name, at(60), jitter_us)
    assert sched.counts["skipped"] == 0


async def test_a_takeover_does_not_resend_a_slot_whose_send_instant_passed(rig) -> None:
    sched, clock, target = rig
    sched.register(cfg("a", "@every 60s", 1, jitter=50))
    await advance(sched, clock, 100)
    first = target.slots("a")
    sched.set_active(False)
    await advance(sched, clock, 40)  # 12:02:20
    await sched.rebase(clock.now() - timedelta(seconds=30), {1: first[-1]} if first else {})
    sched.set_active(True)
    await advance(sched, clock, 200)
    slots = target.slots("a")
    assert len(slots) == len(set(slots)) and slots == sorted(slots)
    assert sched.counts["skipped"] == 0
