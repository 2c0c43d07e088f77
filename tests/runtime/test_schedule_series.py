"""Metric series of single schedules stay bounded: 100,000 schedules make at most 2,000 series,
the schedules that opt in (options.metrics) always have theirs, and the others only while they
are among the PM_METRICS_SCHEDULES latest."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from periodic_manager.contracts import RunRecord, RunStatus, SlotReason
from periodic_manager.runtime.metrics import ManagerMetrics, ManagerView
from periodic_manager.runtime.schedule_series import ScheduleSeries

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
N = 100_000


@dataclass
class Config:
    queue: str
    options: dict[str, Any]


@dataclass
class Entry:
    key: str
    config: Config


@dataclass
class View:
    """What the metrics read of a manager (a leader holding 64 partitions, synced)."""

    by_key: dict[str, Entry] = field(default_factory=dict)
    default_target: str = "redis"
    is_leader: bool = True
    last_sync_at: datetime | None = T0
    last_sync_error: str | None = None
    partitions: frozenset[int] = frozenset(range(64))
    partition_handovers: int = 0
    signals_ignored: int = 0
    standing_down: str | None = None
    stand_downs: int = 0
    clock_offset_s: float | None = 0.01

    def entries(self) -> list[Entry]:
        return list(self.by_key.values())

    def entry(self, key: str) -> Entry | None:
        return self.by_key.get(key)


def manager(opted: set[int], limit: int = 100) -> tuple[View, ManagerMetrics]:
    view = View()
    for i in range(N):
        options: dict[str, Any] = {"metrics": True} if i in opted else {}
        if i % 3 == 0:
            options["target"] = "celery"
        view.by_key[str(i)] = Entry(str(i), Config(f"q{i % 7}", options))
    return view, ManagerMetrics(cast(ManagerView, view), schedules=limit)


def run(
    i: int, late: float, status: RunStatus = "enqueued", reason: SlotReason | None = None
) -> RunRecord:
    slot = T0 + timedelta(minutes=1)
    return RunRecord(
        str(i), f"s{i:06d}", slot, status, slot + timedelta(seconds=late), reason=reason
    )


def series(metrics: ManagerMetrics) -> dict[str, int]:
    """Samples by family of what the registry serves (the schedule families and the rest)."""
    out: dict[str, int] = {}
    for family in metrics.collect():
        if family.samples:
            out[family.name] = len(family.samples)
    return out


def test_100k_schedules_make_at_most_2000_series_and_the_latest_and_opted_have_theirs() -> None:
    rng = random.Random(7)
    opted = set(rng.sample(range(N), 20))
    _, metrics = manager(opted)
    late = {i: rng.uniform(0, 5) for i in range(N)}
    for _ in range(2):  # two slots of every schedule, in bursts as a manager sends them
        batch = []
        for i in range(N):
            if i % 50 == 0:
                batch.append(run(i, late[i] + 40, "skipped", "late"))
            elif i % 97 == 0:
                batch.append(run(i, 0.0, "failed", "refused"))
            else:
                batch.append(run(i, late[i]))
            if len(batch) == 10_000:
                metrics.observe_runs(batch)
                batch = []
        metrics.observe_runs(batch)
    counted = series(metrics)
    assert sum(counted.values()) <= 2000, counted
    watched = set(metrics.schedules.names())
    names = {f"s{i:06d}" for i in opted}
    assert names <= watched
    # The 100 others: the latest by their worst lateness (the skipped ones, 40 s and more late).
    worst = {i: late[i] + 40 if i % 50 == 0 else late[i] for i in range(N) if i % 97 or i % 50 == 0}
    latest = sorted((i for i in worst if i not in opted), key=worst.__getitem__)[-100:]
    assert watched - names == {f"s{i:06d}" for i in latest}
    # Every run is in the aggregates per queue and target, watched or not.
    total = sum(n for n in metrics._runs.values())
    assert total == 2 * N
    assert {target for _, target, _ in metrics._runs} == {"redis", "celery"}


def test_a_schedule_that_falls_out_of_the_latest_loses_its_series() -> None:
    watched = ScheduleSeries(limit=2)
    watched.observe("a", False, "enqueued", None, 1.0, True)
    watched.observe("b", False, "enqueued", None, 2.0, True)
    watched.observe("c", False, "enqueued", None, 0.5, True)  # not late enough: not watched
    assert sorted(watched.names()) == ["a", "b"]
    watched.observe("d", False, "skipped", "late", 9.0, False)  # later than a: a goes
    assert sorted(watched.names()) == ["b", "d"]
    assert watched.slots["d"] == {("skipped", "late"): 1} and "d" not in watched.lateness
    watched.observe("b", False, "enqueued", None, 0.1, True)  # still watched: counted
    assert watched.slots["b"] == {("enqueued", "none"): 2}
    # Buckets 1 ms, 10 ms, 100 ms, 1 s, 10 s, 60 s, +Inf: 0.1 s and 2 s.
    assert watched.lateness["b"].counts == [0, 0, 1, 0, 1, 0, 0]


def test_opted_in_schedules_are_watched_even_with_no_limit() -> None:
    watched = ScheduleSeries(limit=0)
    watched.observe("quiet", True, "enqueued", None, 0.0, True)
    watched.observe("late", False, "enqueued", None, 50.0, True)
    assert list(watched.names()) == ["quiet"]
