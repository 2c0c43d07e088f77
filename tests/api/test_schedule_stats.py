"""``GET /schedules/{id}/stats``: a schedule's lateness percentiles and outcomes over the last
hour and day, on every backend, from run rows written through the runtime store at known
lateness (and a row written with SQL), with the API's virtual clock."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import SLOT_REASONS, RunRecord
from periodic_manager.db.models import runs_table
from periodic_manager.db.store import DatabaseRuntimeStore
from tests.support.api import T0, assert_error, assert_problem, create, iso

MS = timedelta(milliseconds=1)
STATUSES = ("enqueued", "duplicate", "resent", "skipped", "failed", "held", "triggered")


def rec(key: str, at: datetime, status: Any, late_ms: int, reason: Any = None) -> RunRecord:
    """A run handled at ``at``, ``late_ms`` after its slot."""
    return RunRecord(key, f"job.{key}", at - late_ms * MS, status, at, reason=reason)


def zeros(names: tuple[str, ...], **counts: int) -> dict[str, int]:
    return {**dict.fromkeys(names, 0), **{k.replace("_", "-"): v for k, v in counts.items()}}


def statuses(**counts: int) -> dict[str, int]:
    return {**zeros((*STATUSES, "backfilled")), **counts}


async def test_exact_percentiles_and_counts_per_window(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    key = str((await create(client))["id"])
    other = str((await create(client, name="other"))["id"])
    store = DatabaseRuntimeStore(engine, runs_per_schedule=10_000)
    # Last hour: 100 sent slots 30 s apart, 1..100 ms late (98 enqueued, a duplicate, a resent),
    # 2 skipped late (the newest of them 2 min ago), a held slot (overlap), a target-down failure.
    hour = [
        rec(key, T0 - timedelta(seconds=30 * i), "enqueued", i)
        if i <= 98
        else rec(key, T0 - timedelta(seconds=30 * i), "duplicate" if i == 99 else "resent", i)
        for i in range(1, 101)
    ]
    hour += [
        rec(key, T0 - timedelta(minutes=2), "skipped", 40_000, "late"),
        rec(key, T0 - timedelta(minutes=10), "skipped", 45_000, "late"),
        rec(key, T0 - timedelta(minutes=20), "held", 0, "overlap"),
        rec(key, T0 - timedelta(minutes=30), "failed", 31_000, "target-down"),
    ]
    # Earlier in the day: 10 slots 5 s late, an excluded slot, an overlap-released one (sent).
    day = [rec(key, T0 - timedelta(hours=2, minutes=i), "enqueued", 5000) for i in range(10)]
    day += [
        rec(key, T0 - timedelta(hours=3), "skipped", 0, "excluded"),
        rec(key, T0 - timedelta(hours=23), "enqueued", 7, "overlap-released"),
    ]
    # Not counted: before the day, another schedule's runs.
    before = [
        rec(key, T0 - timedelta(hours=25), "enqueued", 99_999),
        rec(key, T0 - timedelta(hours=30), "skipped", 50_000, "late"),
    ]
    others = [rec(other, T0 - timedelta(minutes=1), "enqueued", 88_000)]
    await store.record_runs(hour + day + before + others)

    r = await client.get(f"/schedules/{key}/stats")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["schedule_id"] == int(key) and body["now"] == iso(T0)
    assert body["last_hour"] == {
        "since": iso(T0 - timedelta(hours=1)),
        "runs": 104,
        "sent": 100,
        # nearest rank: the 50th and the 99th of 1..100 ms
        "lateness_p50_s": 0.05,
        "lateness_p99_s": 0.099,
        "by_status": statuses(enqueued=98, duplicate=1, resent=1, skipped=2, held=1, failed=1),
        "by_reason": zeros(SLOT_REASONS, late=2, overlap=1, target_down=1),
    }
    # The day: 111 sent (1..100 ms, 7 ms, 10 x 5000 ms): rank 56 is 55 ms, rank 110 is 5 s.
    assert body["last_day"] == {
        "since": iso(T0 - timedelta(days=1)),
        "runs": 116,
        "sent": 111,
        "lateness_p50_s": 0.055,
        "lateness_p99_s": 5.0,
        "by_status": statuses(enqueued=109, duplicate=1, resent=1, skipped=3, held=1, failed=1),
        "by_reason": zeros(
            SLOT_REASONS, late=2, overlap=1, target_down=1, excluded=1, overlap_released=1
        ),
    }
    assert body["last_late"] == {
        "slot_at": iso(T0 - timedelta(minutes=2, seconds=40)),
        "at": iso(T0 - timedelta(minutes=2)),
        "status": "skipped",
        "reason": "late",
        "lateness_s": 40.0,
        "error": None,
    }


async def test_windows_follow_the_api_clock(
    client: httpx.AsyncClient, engine: AsyncEngine, clock: VirtualClock
) -> None:
    """The windows end at the API's now: an hour later, the hour's runs are in the day only,
    and the newest late run is found even when it left both windows."""
    key = str((await create(client))["id"])
    store = DatabaseRuntimeStore(engine)
    await store.record_runs(
        [
            rec(key, T0 - timedelta(minutes=5), "enqueued", 12),
            rec(key, T0 - timedelta(minutes=6), "failed", 31_000, "target-down"),
        ]
    )
    clock.set(T0 + timedelta(hours=1))
    body = (await client.get(f"/schedules/{key}/stats")).json()
    assert body["now"] == iso(T0 + timedelta(hours=1))
    assert body["last_hour"]["runs"] == 0 and body["last_hour"]["lateness_p50_s"] is None
    assert body["last_day"]["runs"] == 2 and body["last_day"]["lateness_p99_s"] == 0.012
    clock.set(T0 + timedelta(days=1, hours=1))
    body = (await client.get(f"/schedules/{key}/stats")).json()
    assert body["last_day"]["runs"] == 0
    assert body["last_late"]["reason"] == "target-down"
    assert body["last_late"]["slot_at"] == iso(T0 - timedelta(minutes=6, seconds=31))


async def test_a_schedule_without_history(client: httpx.AsyncClient) -> None:
    key = (await create(client))["id"]
    body = (await client.get(f"/schedules/{key}/stats")).json()
    for window in (body["last_hour"], body["last_day"]):
        assert window["runs"] == 0 and window["sent"] == 0
        assert window["lateness_p50_s"] is None and window["lateness_p99_s"] is None
        assert window["by_status"] == statuses()
        assert window["by_reason"] == zeros(SLOT_REASONS)
    assert body["last_late"] is None


async def test_rows_written_with_sql_are_counted_as_other(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """A status or reason no writer uses (SQL wrote it) is counted under ``other``, and is no
    sent slot: it never moves the percentiles."""
    key = str((await create(client))["id"])
    row = {
        "schedule_key": key,
        "name": "x",
        "slot_at": T0 - timedelta(minutes=1),
        "at": T0 - timedelta(minutes=1),
        "lateness_ms": 123_456,
    }
    async with engine.begin() as conn:
        await conn.execute(
            insert(runs_table),
            [
                {**row, "status": "weird", "reason": "bogus"},
                {**row, "status": "enqueued", "reason": None, "lateness_ms": 3},
            ],
        )
    hour = (await client.get(f"/schedules/{key}/stats")).json()["last_hour"]
    assert hour["by_status"] == statuses(enqueued=1, other=1)
    assert hour["by_reason"] == {**zeros(SLOT_REASONS), "other": 1}
    assert (hour["runs"], hour["sent"], hour["lateness_p99_s"]) == (2, 1, 0.003)


async def test_unknown_and_bad_ids(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/schedules/999/stats"), 404)
    for bad in ("abc", "0", "-1", str(2**63)):
        assert_error(await client.get(f"/schedules/{bad}/stats"), 422, ["path", "schedule_id"])


async def test_only_the_days_newest_runs_are_counted(
    client: httpx.AsyncClient, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However large the history cap, the counts read at most STATS_SAMPLE runs: the newest."""
    from periodic_manager.api.routes import runs

    monkeypatch.setattr(runs, "STATS_SAMPLE", 50)
    key = str((await create(client))["id"])
    # 100 slots, one a minute, i ms late: the 50 newest are 1..50 ms late.
    store = DatabaseRuntimeStore(engine, runs_per_schedule=1000)
    await store.record_runs(
        [rec(key, T0 - timedelta(minutes=i), "enqueued", i) for i in range(1, 101)]
    )
    body = (await client.get(f"/schedules/{key}/stats")).json()
    assert (body["last_day"]["runs"], body["last_day"]["lateness_p99_s"]) == (50, 0.05)
    assert (body["last_hour"]["runs"], body["last_hour"]["lateness_p50_s"]) == (50, 0.025)
