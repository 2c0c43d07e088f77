"""options.exclude in the engine (virtual clock, in-memory target): a slot on an excluded local
date is not sent and is recorded ``skipped`` (reason ``excluded``), whether its instant was staged
with other entries, reached unstaged, or sent at a jittered instant; the entry moves on to its
next slot; a ``fire_once`` catch-up never sends an excluded slot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import RunRecord
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.schedules.calendars import check_spec, exclusion
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.targets.memory import MemoryTarget

T0 = datetime(2024, 5, 1, 21, 0, 30, tzinfo=UTC)  # 23:00:30 in Berlin, 1 May
DAY2 = exclusion(["d2"], {"d2": check_spec({"dates": ["2024-05-02"]})})


def cfg(name: str, spec: str, excluded: bool = True, **options: Any) -> PeriodicTaskConfig:
    config = PeriodicTaskConfig.create(
        name=name,
        spec=spec,
        task_type="t",
        timezone="Europe/Berlin",
        options={**options, "exclude": ["d2"]} if excluded else options,
    )
    if excluded:
        config.exclusion = DAY2
    return config


class Rig:
    def __init__(self) -> None:
        self.clock = VirtualClock(T0)
        self.target = MemoryTarget()
        self.runs: list[RunRecord] = []

    async def on_runs(self, batch: Any) -> None:
        self.runs.extend(batch)

    def skipped(self, name: str) -> list[tuple[datetime, str | None, str | None]]:
        return [
            (r.slot, r.reason, r.error)
            for r in self.runs
            if r.name == name and r.status == "skipped"
        ]


@pytest.fixture
async def rig() -> AsyncIterator[tuple[Rig, Scheduler]]:
    r = Rig()
    sched = Scheduler(r.target, clock=r.clock, grace=30, on_runs=r.on_runs)
    task = asyncio.create_task(sched.run())
    await r.clock.settle()
    yield r, sched
    sched.stop()
    await asyncio.wait_for(task, 5)


async def advance_to(r: Rig, sched: Scheduler, instant: datetime) -> None:
    await r.clock.advance_to(instant, settle=lambda: sched.wait_processed(r.clock.now()))


def utc(hh: int, mm: int = 0, day: int = 1) -> datetime:
    return datetime(2024, 5, day, hh, mm, tzinfo=UTC)


async def test_a_staged_instant_sends_the_others_and_skips_the_excluded(rig: Any) -> None:
    r, sched = rig
    held = [sched.register(cfg(f"ex{i}", "*/30 * * * *")) for i in range(50)]
    for i in range(50):
        sched.register(cfg(f"in{i}", "*/30 * * * *", excluded=False))
    # 21:30Z is 23:30 on 1 May in Berlin (sent); 22:00Z and 22:30Z are 2 May there (excluded).
    await advance_to(r, sched, utc(22, 45))
    assert r.target.slots("ex0") == [utc(21, 30)]
    assert r.target.slots("in0") == [utc(21, 30), utc(22), utc(22, 30)]
    assert len(r.target.messages) == 50 * 4
    reason = "excluded: 2024-05-02 is in calendar 'd2'"
    assert r.skipped("ex7") == [(utc(22), "excluded", reason), (utc(22, 30), "excluded", reason)]
    assert r.skipped("in7") == []
    assert held[7].next_slot == utc(23) and held[7].fired == utc(22, 30)


async def test_a_jittered_slot_on_an_excluded_date_is_skipped_too(rig: Any) -> None:
    r, sched = rig
    sched.register(cfg("jit", "*/30 * * * *", jitter=60))
    await advance_to(r, sched, utc(22, 45))
    assert r.target.slots("jit") == [utc(21, 30)]
    assert [s for s, _, _ in r.skipped("jit")] == [utc(22), utc(22, 30)]


async def test_a_catch_up_never_sends_an_excluded_slot(rig: Any) -> None:
    r, sched = rig
    excluded = sched.register(cfg("late", "0 * * * *", misfire="fire_once"))
    # 21:00Z is 23:00 on 1 May in Berlin (sent); 22:00Z is 00:00 on 2 May (excluded).
    await sched.catch_up([(excluded, utc(21)), (excluded, utc(22))])
    assert r.target.slots("late") == [utc(21)]
