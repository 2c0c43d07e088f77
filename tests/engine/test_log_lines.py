"""Log lines that scale: what happens to many schedules at one instant is one line per reason,
with the count and a few names (the run history has each schedule); every failure line names
its cause, even an exception without a message."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import EnqueueResult, RunRecord, Task, refused
from periodic_manager.engine.lines import few
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.errors import TargetError, cause
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.targets.memory import MemoryTarget

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
N = 2000


class Refusing(MemoryTarget):
    """Refuses for good the tasks whose name starts with ``bad``, fails those starting with
    ``flaky`` (not for good), takes the others."""

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        out: list[EnqueueResult] = []
        for task in tasks:
            if task.name.startswith("bad"):
                out.append(refused(task, "task_type must be a dotted path"))
            elif task.name.startswith("flaky"):
                out.append(EnqueueResult(task, "failed", error="ConnectionError: reset"))
            else:
                out += await super().enqueue([task], now)
        return out


def cfg(name: str) -> PeriodicTaskConfig:
    return PeriodicTaskConfig.create(name=name, spec="@every 10s", task_type="demo.task")


@pytest.fixture
async def rig() -> AsyncIterator[tuple[Scheduler, VirtualClock, list[RunRecord]]]:
    clock = VirtualClock(T0)
    runs: list[RunRecord] = []

    async def on_runs(batch: Sequence[RunRecord]) -> None:
        runs.extend(batch)

    sched = Scheduler(Refusing(), clock=clock, grace=30, on_runs=on_runs)
    task = asyncio.create_task(sched.run())
    await clock.settle()
    yield sched, clock, runs
    sched.stop()
    await asyncio.wait_for(task, 5)


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


async def test_a_manager_fallen_behind_says_the_late_slots_of_an_instant_in_one_line(
    rig: tuple[Scheduler, VirtualClock, list[RunRecord]], caplog: pytest.LogCaptureFixture
) -> None:
    sched, clock, runs = rig
    for i in range(N):
        sched.register(cfg(f"s{i:05d}"))
    clock.set(T0 + timedelta(hours=1, seconds=5))  # fell an hour behind
    await clock.advance(0, settle=lambda: sched.wait_processed(clock.now()))
    skipped = [r for r in runs if r.status == "skipped"]
    assert len(skipped) == N and {r.reason for r in skipped} == {"late"}
    [line] = lines(caplog, "skipping")
    assert line.levelno == logging.WARNING
    assert line.getMessage() == (
        f"skipping {N} slot(s) due {(T0 + timedelta(seconds=10)).isoformat()}: "
        f"3595.000 s late (grace 30.000 s): s00000, s00001, s00002, s00003, s00004 and "
        f"{N - 5:,} more"
    )
    assert line.batch == N and line.schedules == [f"s{i:05d}" for i in range(5)]  # type: ignore[attr-defined]


async def test_refusals_and_failures_of_one_instant_are_one_line_per_reason(
    rig: tuple[Scheduler, VirtualClock, list[RunRecord]], caplog: pytest.LogCaptureFixture
) -> None:
    sched, clock, runs = rig
    for i in range(300):
        sched.register(cfg(f"bad{i:03d}"))
        sched.register(cfg(f"ok{i:03d}"))
    await clock.advance(20, settle=lambda: sched.wait_processed(clock.now()))
    failed = [r for r in runs if r.status == "failed"]
    assert len(failed) == 600  # two slots, every refusal recorded
    # Said once for the first slot; the second one, the same refusal again, is not news.
    [line] = lines(caplog, "refused by the target")
    assert line.levelno == logging.ERROR
    assert line.getMessage().startswith(
        "enqueue refused by the target (not retried) for 300 slot(s) due "
        f"{(T0 + timedelta(seconds=10)).isoformat()}: task_type must be a dotted path: "
        "bad000, bad001, bad002, bad003, bad004 and 295 more"
    )


async def test_transient_failures_of_one_instant_are_one_line_naming_the_cause(
    rig: tuple[Scheduler, VirtualClock, list[RunRecord]], caplog: pytest.LogCaptureFixture
) -> None:
    sched, clock, runs = rig
    for i in range(40):
        sched.register(cfg(f"flaky{i:02d}"))
    await clock.advance(10, settle=lambda: sched.wait_processed(clock.now()))
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in said] == [
        "enqueue failed, retrying while slots are within grace: ConnectionError: reset"
    ]
    assert said[0].batch == 40  # type: ignore[attr-defined]


def test_few_names_all_up_to_five_then_a_count() -> None:
    assert few(["a"]) == "a"
    assert few(list("abcde")) == "a, b, c, d, e"
    assert few(list("abcdefg")) == "a, b, c, d, e and 2 more"


def test_a_cause_without_a_message_is_its_type() -> None:
    assert cause(TimeoutError()) == "TimeoutError"
    assert cause(TargetError("redis: down")) == "TargetError: redis: down"
