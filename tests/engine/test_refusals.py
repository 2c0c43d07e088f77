"""One schedule's failing task never holds another's next instant (issue 36, first part).

A task the target refuses for good is recorded failed at once and never retried; a task that
fails in a way a retry may mend is retried beside the loop, within grace, while the other
schedules go out on time. Virtual clock, in-memory target.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import EnqueueResult, RunRecord, Task, refused
from periodic_manager.engine.dispatch import Hooks
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.errors import TargetError
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.targets.memory import MemoryTarget

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


class Picky(MemoryTarget):
    """Refuses the tasks of ``refuse`` for good, fails those of ``flaky`` (not for good) while
    ``flaky_until`` is ahead; records every call's task names."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock
        self.refuse: set[str] = set()
        self.flaky: set[str] = set()
        self.flaky_until: datetime | None = None
        self.calls: list[list[str]] = []

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        self.calls.append([t.name for t in tasks])
        if self.fail_with is not None:
            raise TargetError(self.fail_with)
        out: list[EnqueueResult | None] = [None] * len(tasks)
        send = []
        for i, task in enumerate(tasks):
            if task.name in self.refuse:
                out[i] = refused(task, "picky: task_type must be a dotted path")
            elif task.name in self.flaky and self.flaky_until and now < self.flaky_until:
                out[i] = EnqueueResult(task, "failed", error="picky: ConnectionError: reset")
            else:
                send.append(i)
        sent = await super().enqueue([tasks[i] for i in send], now)
        for i, res in zip(send, sent, strict=True):
            out[i] = res
        return [r for r in out if r is not None]


@pytest.fixture
async def rig() -> AsyncIterator[tuple[Scheduler, VirtualClock, Picky]]:
    clock = VirtualClock(T0)
    target = Picky(clock)
    runs: list[RunRecord] = []

    async def on_runs(batch: Sequence[RunRecord]) -> None:
        runs.extend(batch)

    sched = Scheduler(target, clock=clock, grace=30, on_runs=on_runs)
    sched.runs = runs  # type: ignore[attr-defined]
    task = asyncio.create_task(sched.run())
    await clock.settle()
    yield sched, clock, target
    sched.stop()
    await asyncio.wait_for(task, 5)


def cfg(name: str, spec: str = "@every 1s", **kw: Any) -> PeriodicTaskConfig:
    return PeriodicTaskConfig.create(name=name, spec=spec, task_type="demo.task", **kw)


async def advance(sched: Scheduler, clock: VirtualClock, seconds: float) -> None:
    await clock.advance(seconds, settle=lambda: sched.wait_processed(clock.now()))


def lateness(target: MemoryTarget, name: str) -> list[float]:
    return [(at - t.scheduled_at).total_seconds() for t, at in target.messages if t.name == name]


async def test_a_refused_task_fails_at_once_and_the_others_stay_on_time(
    rig: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sched, clock, target = rig
    errors: list[tuple[str, list[str]]] = []
    sched.dispatcher.hooks = Hooks(
        on_error=lambda exc, tasks: errors.append((str(exc), [t.name for t in tasks]))
    )
    target.refuse = {"bad"}
    sched.register(cfg("good"))
    sched.register(cfg("good.minute", "* * * * *"))
    bad = sched.register(cfg("bad"))
    await advance(sched, clock, 180)  # three minutes of @every 1s
    assert len(lateness(target, "good")) == 180
    assert max(lateness(target, "good")) == 0.0  # every slot at its instant
    assert lateness(target, "good.minute") == [0.0, 0.0, 0.0]
    assert target.slots("bad") == []
    # Every slot of "bad" went to the target once (no retry) and is recorded failed with why.
    assert sum(names.count("bad") for names in target.calls) == 180
    runs = [r for r in sched.runs if r.name == "bad"]
    assert len(runs) == 180 and {r.status for r in runs} == {"failed"}
    assert {r.error for r in runs} == {"picky: task_type must be a dotted path"}
    assert bad.last_error == "picky: task_type must be a dotted path"
    assert sched.counts["failed"] == 180 and sched.counts["enqueued"] == 183
    assert len(errors) == 180 and errors[0] == ("picky: task_type must be a dotted path", ["bad"])
    refusals = [r for r in caplog.records if "refused by the target" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].levelno == logging.ERROR  # once, not each second
    assert sched.dispatcher.retries.tasks == set()


async def test_a_transient_failure_is_retried_beside_the_loop_and_sent_once(
    rig: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sched, clock, target = rig
    target.flaky = {"flaky"}
    target.flaky_until = T0 + timedelta(seconds=72)  # fails 12 s past its slot at 60
    sched.register(cfg("good"))
    flaky = sched.register(cfg("flaky", "@every 60s"))
    await advance(sched, clock, 100)
    # The other schedule never waited for the retries: every slot at its instant.
    assert len(lateness(target, "good")) == 100 and max(lateness(target, "good")) == 0.0
    # The failing one was retried (alone) until it went through, within grace, once.
    assert target.slots("flaky") == [T0 + timedelta(seconds=60)]
    late = lateness(target, "flaky")[0]
    assert 12 <= late <= 12 + sched.dispatcher.retry_max
    assert sum(names.count("flaky") for names in target.calls) > 3
    assert all(names == ["flaky"] for names in target.calls if "flaky" in names and len(names) == 1)
    runs = [(r.slot, r.status) for r in sched.runs if r.name == "flaky"]
    assert runs == [(T0 + timedelta(seconds=60), "enqueued")]  # one run: its final outcome
    assert flaky.last_error is None  # cleared by the send
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 2 and "retrying" in said[0] and "recovered" in said[1]  # once each
    assert sched.dispatcher.retries.tasks == set()


async def test_a_transient_failure_past_grace_is_given_up_and_the_others_go_on(rig: Any) -> None:
    sched, clock, target = rig
    errors: list[str] = []
    sched.dispatcher.hooks = Hooks(on_error=lambda exc, tasks: errors.append(str(exc)))
    target.flaky = {"flaky"}
    target.flaky_until = T0 + timedelta(hours=1)
    sched.register(cfg("good"))
    sched.register(cfg("flaky", "@every 60s"))
    await advance(sched, clock, 130)
    assert max(lateness(target, "good")) == 0.0 and len(lateness(target, "good")) == 130
    runs = [(r.slot, r.status, r.error) for r in sched.runs if r.name == "flaky"]
    assert runs == [(T0 + timedelta(seconds=60), "failed", "picky: ConnectionError: reset")]
    assert errors == ["picky: ConnectionError: reset"]  # the slot at 120 still retrying
    assert len(sched.dispatcher.retries.tasks) == 1


async def test_a_stop_during_a_retry_records_it_quietly(
    rig: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sched, clock, target = rig
    target.flaky = {"flaky"}
    target.flaky_until = T0 + timedelta(hours=1)
    sched.register(cfg("flaky", "@every 60s"))
    await advance(sched, clock, 65)
    assert len(sched.dispatcher.retries.tasks) == 1
    caplog.clear()
    sched.stop()
    await asyncio.sleep(0)
    for _ in range(100):
        if not sched.dispatcher.retries.tasks:
            break
        await clock.settle()
    assert sched.dispatcher.retries.tasks == set()
    assert [r.levelno for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert [(r.status, r.error) for r in sched.runs] == [
        ("failed", "picky: ConnectionError: reset")
    ]


async def test_a_fenced_entry_is_not_retried(rig: Any) -> None:
    sched, clock, target = rig
    target.flaky = {"flaky"}
    target.flaky_until = T0 + timedelta(hours=1)
    entry = sched.register(cfg("flaky", "@every 60s"))
    await advance(sched, clock, 61)
    calls = len(target.calls)
    sched.fence(lambda ident: ident == entry.ident)  # its partition is lost
    await advance(sched, clock, 10)
    assert len(target.calls) == calls  # no call after the fence
    assert sched.dispatcher.retries.tasks == set()
    assert [r.status for r in sched.runs] == ["failed"]


async def test_while_the_target_is_down_the_retries_probe_it_one_at_a_time(rig: Any) -> None:
    sched, clock, target = rig
    sched.register(cfg("a"))
    target.fail_with = "redis down"
    await advance(sched, clock, 120)
    # One first attempt per instant, and the retries of ~30 slots within grace share one probe
    # spaced like one retry's backoff (each retrying alone: 9 calls a second).
    assert len(target.calls) <= 1.1 * 120
    assert len(sched.dispatcher.retries.tasks) >= 25
    target.fail_with = None
    await advance(sched, clock, 30)
    # Back: every slot still within grace was sent, once each.
    sent = target.slots("a")
    assert len(sent) == len(set(sent)) and T0 + timedelta(seconds=100) in sent
    assert sched.dispatcher.retries.tasks == set()


async def test_a_hand_over_waits_for_a_retry_call_under_way(rig: Any) -> None:
    sched, clock, target = rig
    target.flaky = {"flaky"}
    target.flaky_until = T0 + timedelta(seconds=60, milliseconds=100)
    sched.register(cfg("flaky", "@every 60s"))
    gate = asyncio.Event()
    plain = target.enqueue

    async def held(tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        if len(target.calls) >= 1:  # the retry's call hangs until the gate opens
            await gate.wait()
        return await plain(tasks, now)

    target.enqueue = held  # type: ignore[method-assign]
    await advance(sched, clock, 60.5)  # the first attempt failed, the retry's call is under way
    flush = asyncio.create_task(sched.flush_runs())
    await clock.settle()
    assert not flush.done()  # a hand-over records what was sent after that call ends
    gate.set()
    assert await asyncio.wait_for(flush, 5)
    assert [(r.name, r.status) for r in sched.runs] == [("flaky", "enqueued")]


async def test_a_held_slot_under_retry_is_not_sent_again_by_its_hold_tick(rig: Any) -> None:
    sched, clock, target = rig
    busy = {"on": True}
    plain = target.enqueue

    async def hold_then_fail(tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        if busy["on"]:
            target.calls.append([t.name for t in tasks])
            return [EnqueueResult(t, "busy") for t in tasks]
        return await plain(tasks, now)

    target.enqueue = hold_then_fail  # type: ignore[method-assign]
    target.completion_off = lambda options: None  # type: ignore[method-assign]
    sched.register(cfg("held", "@every 60s", options={"overlap": "hold"}))
    await advance(sched, clock, 60)  # slot 60 busy: held, tried again every tick (1 s)
    assert [r.status for r in sched.runs] == ["held"]
    target.flaky = {"held"}
    target.flaky_until = T0 + timedelta(seconds=75)
    busy["on"] = False
    await advance(sched, clock, 1)  # the tick sends it: it fails, a retry takes it
    assert len(sched.dispatcher.retries.tasks) == 1
    await advance(sched, clock, 25)
    # One call per retry (its backoff), none from the ticks meanwhile; then sent once.
    assert target.slots("held") == [T0 + timedelta(seconds=60)]
    calls = [c for c in target.calls if c == ["held"]]
    assert len(calls) <= 1 + 1 + 8, len(calls)  # busy, the tick's attempt, the retries
    assert [r.status for r in sched.runs] == ["held", "enqueued"]


async def test_a_refusal_is_said_again_after_the_schedule_was_sent_meanwhile(
    rig: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sched, clock, target = rig
    sched.register(cfg("bad"))
    target.refuse = {"bad"}
    await advance(sched, clock, 3)
    target.refuse = set()  # fixed (say, its worker's module deployed): sent
    await advance(sched, clock, 2)
    target.refuse = {"bad"}
    await advance(sched, clock, 3)
    said = [r for r in caplog.records if "refused by the target" in r.getMessage()]
    assert len(said) == 2
