"""options.overlap in the scheduler, on a virtual clock, against real Redis Streams.

The workers here are the test itself: it reads messages with the consumer group (a task starts)
and acknowledges them (it finishes), so every step is deterministic. Real worker processes are in
test_overlap_workers.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import RunRecord
from periodic_manager.engine.entry import ScheduledEntry
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.runtime.timing import Timing
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.targets.redis.streams import RedisStreamsTarget
from tests.support.managers import ManualLeader

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
GROUP = "workers"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def cfg(name: str, spec: str = "@every 10s", **options: Any) -> PeriodicTaskConfig:
    return PeriodicTaskConfig.create(name=name, spec=spec, task_type="demo", options=options)


class Rig:
    def __init__(self, client: aioredis.Redis, prefix: str, clock: VirtualClock) -> None:
        self.client = client
        self.prefix = prefix
        self.clock = clock
        self.schedulers: list[Scheduler] = []
        self.runs: list[RunRecord] = []
        self._tasks: list[asyncio.Task[None]] = []

    def scheduler(self, **kw: Any) -> Scheduler:
        target = RedisStreamsTarget(self.client, prefix=self.prefix, group=GROUP)

        async def on_runs(batch: Any) -> None:
            self.runs.extend(batch)

        sched = Scheduler(target, clock=self.clock, grace=30, on_runs=on_runs, **kw)
        self.schedulers.append(sched)
        self._tasks.append(asyncio.create_task(sched.run()))
        return sched

    @property
    def stream(self) -> str:
        return f"{{{self.prefix}:default}}:stream"

    async def advance_to(self, seconds: float) -> None:
        async def settle() -> None:
            for sched in self.schedulers:
                await sched.wait_processed(self.clock.now())

        await self.clock.advance_to(at(seconds), settle=settle)

    async def take(self) -> list[tuple[str, dict[str, str]]]:
        """A worker takes every new message (they become pending: running)."""
        reply = await self.client.xreadgroup(GROUP, "w1", {self.stream: ">"}, count=100)
        return list(reply[0][1]) if reply else []

    async def finish(self, entry_id: str) -> None:
        await self.client.xack(self.stream, GROUP, entry_id)

    async def messages(self, name: str) -> list[dict[str, str]]:
        return [f for _, f in await self.client.xrange(self.stream) if f["name"] == name]

    def runs_of(self, name: str) -> list[tuple[float, str, str | None]]:
        """(slot in seconds after T0, status, reason) of every run of ``name``, in order."""
        return [
            ((r.slot - T0).total_seconds(), r.status, r.reason) for r in self.runs if r.name == name
        ]

    async def stop(self) -> None:
        for sched in self.schedulers:
            sched.stop()
        await asyncio.wait_for(asyncio.gather(*self._tasks), 10)


@pytest.fixture
async def rig(redis_client: aioredis.Redis, redis_prefix: str) -> AsyncIterator[Rig]:
    clock = VirtualClock(T0)
    made = Rig(redis_client, redis_prefix, clock)
    await redis_client.xgroup_create(made.stream, GROUP, id="0", mkstream=True)
    yield made
    await made.stop()


def slots(messages: list[dict[str, str]]) -> list[str]:
    return [m["scheduled_at"] for m in messages]


async def test_skip_records_the_slot_skipped_while_the_previous_task_runs(rig: Rig) -> None:
    sched = rig.scheduler()
    sched.register(cfg("nightly", overlap="skip"))
    await rig.advance_to(10)
    [(first, _)] = await rig.take()  # running from now on
    await rig.advance_to(20)
    await rig.finish(first)
    await rig.advance_to(30)

    assert slots(await rig.messages("nightly")) == ["2024-05-01T12:00:10Z", "2024-05-01T12:00:30Z"]
    assert rig.runs_of("nightly") == [
        (10, "enqueued", None),
        (20, "skipped", "overlap"),
        (30, "enqueued", None),
    ]
    skipped = rig.runs[1]
    first_id = (await rig.messages("nightly"))[0]["id"]
    assert skipped.error == f"overlap: the previous task {first_id} is running"
    assert sched.counts["skipped"] == 1 and sched.overlap.held == {}


async def test_hold_sends_the_latest_held_slot_at_the_first_tick_after_the_previous_finished(
    rig: Rig,
) -> None:
    sched = rig.scheduler()
    sched.register(cfg("sync", overlap="hold"))
    sched.register(cfg("plain"))  # allow: untouched by the held slots beside it
    await rig.advance_to(10)
    [(first, _)] = [m for m in await rig.take() if m[1]["name"] == "sync"]
    await rig.advance_to(23.5)  # slot 20 held; ticks at 21, 22, 23 find it still busy
    assert sched.overlap.view(sched.get("name:sync").ident).held_slot == at(20)  # type: ignore[union-attr]
    await rig.advance_to(34.5)  # slot 30 held in place of slot 20
    await rig.finish(first)
    await rig.advance_to(36)

    sent = await rig.messages("sync")
    assert slots(sent) == ["2024-05-01T12:00:10Z", "2024-05-01T12:00:30Z"]
    assert sent[1]["enqueued_at"] == "2024-05-01T12:00:35Z"  # the first tick after 34.5
    assert rig.runs_of("sync") == [
        (10, "enqueued", None),
        (20, "held", "overlap"),
        (20, "skipped", "overlap-replaced"),
        (30, "held", "overlap"),
        (30, "enqueued", "overlap-released"),
    ]
    assert sched.overlap.held == {}
    assert len(await rig.messages("plain")) == 3  # 10, 20, 30: never held back


async def test_a_held_slot_past_its_window_is_skipped_and_the_next_slot_starts_afresh(
    rig: Rig,
) -> None:
    sched = rig.scheduler()
    sched.register(cfg("hourly", "@every 60s", overlap="hold"))
    await rig.advance_to(60)
    [(first, _)] = await rig.take()
    await rig.advance_to(95)  # slot 120 is not due yet; slot 60's successor is not either
    await rig.advance_to(125)  # slot 120 held at 120
    await rig.advance_to(151)  # held for 31 s: more than grace (30 s)
    await rig.finish(first)
    await rig.advance_to(180)

    assert rig.runs_of("hourly") == [
        (60, "enqueued", None),
        (120, "held", "overlap"),
        (120, "skipped", "overlap-expired"),
        (180, "enqueued", None),
    ]
    assert slots(await rig.messages("hourly")) == ["2024-05-01T12:01:00Z", "2024-05-01T12:03:00Z"]


async def test_overlap_timeout_counts_an_old_previous_task_finished_with_a_warning(
    rig: Rig,
) -> None:
    sched = rig.scheduler()
    sched.register(cfg("stuck", overlap="skip", overlap_timeout=15))
    await rig.advance_to(10)
    await rig.take()  # its consumer then dies: never acknowledged
    await rig.advance_to(30)

    assert rig.runs_of("stuck") == [
        (10, "enqueued", None),
        (20, "skipped", "overlap"),  # 10 s old: not yet
        (30, "enqueued", "overlap-timeout"),  # 20 s old: counted finished
    ]
    first_id = (await rig.messages("stuck"))[0]["id"]
    assert rig.runs[-1].error == (
        f"overlap-timeout: the previous task {first_id} was still running after overlap_timeout "
        "(15 s); counted as finished"
    )
    assert sched.counts["enqueued"] == 2


async def test_two_schedulers_holding_the_same_slot_release_it_once(rig: Rig) -> None:
    first, second = rig.scheduler(), rig.scheduler()
    for sched in (first, second):
        sched.register(cfg("shared", overlap="hold"))
    await rig.advance_to(10)
    [(running, _)] = await rig.take()
    await rig.advance_to(20.5)
    assert [set(s.overlap.held) for s in (first, second)] == [{"name:shared"}] * 2
    await rig.finish(running)
    await rig.advance_to(21.5)  # both try at the same tick (21)

    assert slots(await rig.messages("shared")) == ["2024-05-01T12:00:10Z", "2024-05-01T12:00:20Z"]
    released = [r.status for r in rig.runs if r.slot == at(20) and r.status != "held"]
    assert sorted(released) == ["duplicate", "enqueued"]
    assert first.overlap.held == {} and second.overlap.held == {}


async def test_losing_leadership_drops_held_slots(rig: Rig) -> None:
    sched = rig.scheduler()
    sched.register(cfg("led", overlap="hold"))
    await rig.advance_to(10)
    await rig.take()
    await rig.advance_to(21)
    assert sched.overlap.held
    sched.set_active(False)
    assert sched.overlap.held == {} and sched.overlap.wake_at() is None
    await rig.advance_to(40)
    assert slots(await rig.messages("led")) == ["2024-05-01T12:00:10Z"]


async def test_schedules_on_allow_leave_no_overlap_state(rig: Rig) -> None:
    sched = rig.scheduler()
    for i in range(20):
        sched.register(cfg(f"plain{i}"))
    await rig.advance_to(30)
    assert sched.overlap.held == {} and sched.overlap.seen == {}
    assert sched.counts["enqueued"] == 60


async def test_an_edit_to_allow_forgets_what_was_shown_and_unregister_forgets_all(
    rig: Rig,
) -> None:
    sched = rig.scheduler()
    sched.register(cfg("edited", overlap="skip"))
    sched.register(cfg("removed", overlap="hold"))
    await rig.advance_to(10)
    await rig.take()
    await rig.advance_to(21)
    assert set(sched.overlap.seen) == {"name:edited", "name:removed"}
    sched.register(cfg("edited"))
    sched.unregister("name:removed")
    assert sched.overlap.seen == {} and sched.overlap.held == {}


async def test_a_view_change_is_published(rig: Rig) -> None:
    sched = rig.scheduler()
    published: list[tuple[str, Any]] = []

    def changed(entry: ScheduledEntry) -> None:
        published.append((entry.key, sched.overlap.view(entry.ident)))

    sched.overlap.changed = changed
    sched.register(cfg("shown", overlap="hold"))
    await rig.advance_to(10)
    [(running, fields)] = await rig.take()
    await rig.advance_to(23)
    await rig.finish(running)
    await rig.advance_to(25)

    views = [v for _, v in published]
    assert [(v.held_slot, v.previous_task_state) for v in views] == [
        (None, "queued"),  # slot 10 sent: the task the next slot waits for
        (at(20), "running"),  # slot 20 held behind it
        (None, "queued"),  # slot 20 sent at the tick after the finish
    ]
    assert views[1].previous_task_id == fields["id"]


async def test_a_takeover_never_sends_a_held_slot_that_a_newer_one_replaced(rig: Rig) -> None:
    """The issue's reproduction: slot 20 was held, then replaced by slot 30 (recorded skipped);
    the previous task finished, the leader died. The new leader looks back over grace, and
    before, it sent slot 20, out of order. The store records 20 as settled: it starts after it."""
    from periodic_manager.providers import StaticProvider
    from periodic_manager.runtime.manager import PeriodicTaskManager
    from periodic_manager.runtime.memory_store import MemoryRuntimeStore

    store = MemoryRuntimeStore()
    row = PeriodicTaskConfig.create(
        name="sync",
        spec="@every 10s",
        task_type="demo",
        options={"overlap": "hold"},
        schedule_id=1,
        effective_at=T0 - timedelta(days=1),
    )
    managers = []
    for leads in (True, False):
        target = RedisStreamsTarget(rig.client, prefix=rig.prefix, group=GROUP)
        mgr = PeriodicTaskManager(
            StaticProvider([row]),
            target,
            clock=rig.clock,
            store=store,
            timing=Timing(grace=30, sync_interval=3600),
            leadership=ManualLeader(leads),
        )
        await mgr.start()
        managers.append(mgr)
    leader, standby = managers

    live = list(managers)

    async def settle() -> None:
        for m in live:
            await m.wait_settled(rig.clock.now())

    try:
        await rig.clock.advance_to(at(10.5), settle=settle)
        [(first, _)] = await rig.take()
        await rig.clock.advance_to(at(31.5), settle=settle)  # 20 held, then replaced by 30
        assert [(r.slot, r.status) for r in store.runs] == [
            (at(10), "enqueued"),
            (at(20), "held"),
            (at(20), "skipped"),
            (at(30), "held"),
        ]
        await leader.stop()
        live.remove(leader)
        await rig.finish(first)
        await standby.leadership._set(True)  # type: ignore[attr-defined]
        await rig.clock.advance_to(at(33), settle=settle)
        sent = slots(await rig.messages("sync"))
        assert sent == ["2024-05-01T12:00:10Z", "2024-05-01T12:00:30Z"]  # 20 never, 30 once
    finally:
        for m in managers:
            await m.stop()


async def test_a_held_jittered_slot_keeps_its_window_from_its_send_instant(rig: Rig) -> None:
    """options.jitter larger than grace: a slot held at its send instant (slot + offset) is not
    expired for being more than grace after its nominal slot; it is released once the previous
    task finished, with its nominal scheduled_at."""
    from periodic_manager.schedules.jitter import send_at

    jitter_us = 200_000_000

    def offset(name: str, s: int) -> float:
        return (send_at(name, at(s), jitter_us) - at(s)).total_seconds()

    name = next(n for n in (f"jit{i}" for i in range(1000)) if offset(n, 600) > 60)
    sched = rig.scheduler()
    sched.register(cfg(name, "@every 300s", overlap="hold", jitter=200))
    await rig.advance_to(300 + offset(name, 300))
    [(first, _)] = await rig.take()  # running from now on
    await rig.advance_to(600 + offset(name, 600) + 3.5)  # held at its send instant, ticks busy
    assert rig.runs_of(name)[-1] == (600, "held", "overlap")
    await rig.finish(first)
    await rig.advance_to(600 + offset(name, 600) + 5)
    sent = await rig.messages(name)
    assert slots(sent) == ["2024-05-01T12:05:00Z", "2024-05-01T12:10:00Z"]
    assert rig.runs_of(name) == [
        (300, "enqueued", None),
        (600, "held", "overlap"),
        (600, "enqueued", "overlap-released"),
    ]
