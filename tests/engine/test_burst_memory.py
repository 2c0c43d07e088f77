"""What a burst leaves behind once it is over: no per-schedule memo of its runs, and the memory
it freed given back once its history is written (bench/burst_memory.py measures the RSS)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from periodic_manager.contracts import RunRecord
from periodic_manager.engine import history
from periodic_manager.engine.history import RELEASE_AFTER_RUNS, RunWriter
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.runtime.metrics import QUEUE_MEMO_BATCH
from periodic_manager.targets.memory import MemoryTarget

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def runs(n: int) -> list[RunRecord]:
    return [RunRecord(str(i), f"s{i}", T0, "enqueued", T0 + timedelta(seconds=1)) for i in range(n)]


def test_a_bursts_runs_are_counted_without_remembering_a_key_per_schedule() -> None:
    metrics = PeriodicTaskManager(None, MemoryTarget()).metrics
    metrics.observe_runs(runs(QUEUE_MEMO_BATCH + 1))
    assert metrics._labels == {}
    sample = metrics.registry.get_sample_value(
        "periodic_manager_slots_total",
        {"queue": "unknown", "status": "enqueued", "target": "unknown"},
    )
    assert sample == QUEUE_MEMO_BATCH + 1
    metrics.observe_runs(runs(3))  # small batches (frequent schedules) keep the memo
    assert len(metrics._labels) == 3


async def _written(writer: RunWriter, batch: Sequence[RunRecord]) -> None:
    """One write of ``batch`` by the writer's loop (told to stop once it has written)."""
    idle = asyncio.Event()
    idle.set()
    writer.report(batch)
    await asyncio.wait_for(writer.run(idle, lambda: True, asyncio.sleep), 5)


async def test_memory_is_given_back_once_a_bursts_history_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    released: list[int] = []
    stored: list[int] = []

    async def store(batch: Sequence[RunRecord]) -> None:
        stored.append(len(batch))

    monkeypatch.setattr(history.gcpolicy, "release", lambda: released.append(len(stored)))
    writer = RunWriter(store)
    await _written(writer, runs(10))
    assert released == []  # a small write is no burst
    await _written(writer, runs(RELEASE_AFTER_RUNS))
    assert released == [2]  # after the burst's rows were written
