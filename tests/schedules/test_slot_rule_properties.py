"""The engine sends exactly the slots the preview showed (issue 37): for random schedules (cron
and ``@every``, zones with daylight-saving changes, windows across them) and options (bounds, an
exclusion calendar, jitter, max_runs), a scheduler on a virtual clock with the in-memory target
sends, in a window, the slots :meth:`Rule.upcoming` (what the API, the dashboard and
``periodic-manager next`` show) listed for it, each at or after its send instant, and no other.

Bounded: ``SLOT_RULE_EXAMPLES`` examples (default 25); the ``slow`` variant runs 200."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from periodic_manager.clock import VirtualClock
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.errors import ConfigError
from periodic_manager.schedules.calendars import check_spec, exclusion
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.judge import shortest_gap
from periodic_manager.schedules.slots import Rule
from periodic_manager.targets.memory import MemoryTarget

EXAMPLES = int(os.environ.get("SLOT_RULE_EXAMPLES", "25"))
SPECS = [
    "*/7 * * * *",
    "0 * * * *",
    "30 2 * * *",
    "*/20 1-3 * * *",
    "5 */2 * * 1-5",
    "0 0 * * *",
    "@every 97s",
    "@every 20m",
    "@every 1h30m",
]
# Zones and instants around their daylight-saving changes (and one without any).
STARTS = {
    "Europe/Berlin": [
        datetime(2024, 3, 30, 20, tzinfo=UTC),
        datetime(2024, 10, 26, 21, tzinfo=UTC),
    ],
    "America/New_York": [
        datetime(2024, 3, 9, 23, tzinfo=UTC),
        datetime(2024, 11, 2, 22, tzinfo=UTC),
    ],
    "Australia/Lord_Howe": [datetime(2024, 4, 6, 6, tzinfo=UTC)],
    "UTC": [datetime(2024, 5, 1, 0, tzinfo=UTC)],
}


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    zone = draw(st.sampled_from(sorted(STARTS)))
    start = draw(st.sampled_from(STARTS[zone])) + timedelta(seconds=draw(st.integers(0, 6 * 3600)))
    hours = draw(st.integers(2, 30))
    end = start + timedelta(hours=hours)
    options: dict[str, Any] = {}
    if draw(st.booleans()):
        options["start_at"] = _text(start + timedelta(seconds=draw(st.integers(0, hours * 3600))))
    if draw(st.booleans()):
        options["end_at"] = _text(start + timedelta(seconds=draw(st.integers(1, hours * 3600))))
    if draw(st.booleans()):
        options["max_runs"] = draw(st.integers(1, 8))
    days = _local_dates(start, end, zone)
    excluded = draw(st.lists(st.sampled_from(days), unique=True, max_size=len(days) - 1))
    return {
        "spec": draw(st.sampled_from(SPECS)),
        "zone": zone,
        "start": start,
        "end": end,
        "options": options,
        "excluded": excluded,
        "jitter": draw(st.none() | st.floats(0.01, 0.9)),
    }


def _text(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def _local_dates(start: datetime, end: datetime, zone: str) -> list[date]:
    tz = ZoneInfo(zone)
    first, last = start.astimezone(tz).date(), end.astimezone(tz).date()
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def _config(case: dict[str, Any]) -> PeriodicTaskConfig:
    options = dict(case["options"])
    if case["excluded"]:
        options["exclude"] = ["off"]
    if case["jitter"] is not None:
        probe = PeriodicTaskConfig.create(
            name="probe", spec=case["spec"], task_type="t", timezone=case["zone"]
        )
        gap = shortest_gap(probe.schedule)
        assume(gap is not None)
        assert gap is not None
        options["jitter"] = round(gap.total_seconds() * case["jitter"], 3)
    try:
        config = PeriodicTaskConfig.create(
            name="s", spec=case["spec"], task_type="t", timezone=case["zone"], options=options
        )
    except ConfigError:
        assume(False)  # end_at not after start_at: judged out, as a row would be
        raise
    if case["excluded"]:
        days = [d.isoformat() for d in case["excluded"]]
        config.exclusion = exclusion(["off"], {"off": check_spec({"dates": days})})
    return config


async def _engine_sends(
    config: PeriodicTaskConfig, start: datetime, end: datetime
) -> list[tuple[datetime, datetime]]:
    """(slot, sent at) of every task the scheduler sends for a slot before ``end``."""
    clock, target = VirtualClock(start), MemoryTarget()
    sched = Scheduler(target, clock=clock, grace=30)
    task = asyncio.create_task(sched.run())
    try:
        await clock.settle()
        counted = (0, None) if config.options and "max_runs" in config.options else None
        sched.register(config, counted=counted)
        jitter = timedelta(seconds=float(config.options.get("jitter", 0)) + 1)
        await clock.advance_to(end + jitter, settle=lambda: sched.wait_processed(clock.now()))
    finally:
        sched.stop()
        await asyncio.wait_for(task, 5)
    return sorted((t.scheduled_at, at) for t, at in target.messages if t.scheduled_at < end)


def _check(case: dict[str, Any]) -> None:
    config = _config(case)
    start, end = case["start"], case["end"]
    rule = Rule.of(config)
    max_runs = config.options.get("max_runs")
    shown = [s.at for s in rule.upcoming(start, 10_000, left=max_runs) if s.at < end]
    sent = asyncio.run(_engine_sends(config, start, end))
    assert [slot for slot, _ in sent] == shown, (case, config.options)
    for slot, at in sent:
        assert at >= rule.send_at(slot), (slot, at)


SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}


@settings(max_examples=EXAMPLES, **SETTINGS)  # type: ignore[arg-type]
@given(scenarios())
def test_the_engine_sends_exactly_the_previewed_slots(case: dict[str, Any]) -> None:
    _check(case)


@pytest.mark.slow
@settings(max_examples=200, **SETTINGS)  # type: ignore[arg-type]
@given(scenarios())
def test_the_engine_sends_exactly_the_previewed_slots_longer(case: dict[str, Any]) -> None:
    _check(case)
