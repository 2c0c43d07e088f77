"""The http target's completion signal for options.overlap, on every backend: a schedule's slot
waits while its previous delivery is pending, and goes once the receiver answered 2xx (done) or
the delivery ended dead; two managers never both find the schedule free."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.contracts import FINISHED, NONE, UNFINISHED
from periodic_manager.db.engine import create_engine
from periodic_manager.db.models import http_deliveries_table as table
from periodic_manager.targets.http.config import HttpConfig
from periodic_manager.targets.http.target import HttpTarget
from tests.targets.test_http_target import task

T0 = datetime(2026, 2, 1, 8, 0, tzinfo=UTC)
URL = "https://hooks.example.com/in"


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    e = create_engine(db_url)
    yield e
    await e.dispose()


def at(minute: int) -> datetime:
    return T0 + timedelta(minutes=minute)


async def set_state(engine: AsyncEngine, row_id: str, state: str) -> None:
    async with engine.begin() as conn:
        await conn.execute(update(table).where(table.c.id == int(row_id)).values(state=state))


async def test_a_slot_waits_for_the_previous_delivery(engine: AsyncEngine) -> None:
    target = HttpTarget(engine, HttpConfig())
    [first] = await target.enqueue([task("o.s", at(1), URL, overlap="skip")], at(1))
    assert first.status == "enqueued" and first.previous is not None
    assert first.previous.state == NONE
    [busy] = await target.enqueue([task("o.s", at(2), URL, overlap="skip")], at(2))
    assert busy.status == "busy" and busy.previous is not None
    assert (busy.previous.task_id, busy.previous.state) == (first.message_id, UNFINISHED)
    [again] = await target.enqueue([task("o.s", at(1), URL, overlap="skip")], at(2))
    assert again.status == "duplicate" and again.message_id == first.message_id
    assert first.message_id is not None
    await set_state(engine, first.message_id, "done")
    [second] = await target.enqueue([task("o.s", at(3), URL, overlap="skip")], at(3))
    assert second.status == "enqueued" and second.previous is not None
    assert second.previous.state == FINISHED
    assert second.message_id is not None
    await set_state(engine, second.message_id, "dead")  # a dead letter has finished too
    [third] = await target.enqueue([task("o.s", at(4), URL, overlap="hold")], at(4))
    assert third.status == "enqueued"


async def test_an_overlap_timeout_frees_the_schedule(engine: AsyncEngine) -> None:
    target = HttpTarget(engine, HttpConfig())
    opts = {"overlap": "skip", "overlap_timeout": 90}
    await target.enqueue([task("o.t", at(0), URL, **opts)], at(0))
    [young] = await target.enqueue([task("o.t", at(1), URL, **opts)], at(1))
    assert young.status == "busy"
    [old] = await target.enqueue([task("o.t", at(2), URL, **opts)], at(2))
    assert old.status == "enqueued" and old.previous is not None and old.previous.timed_out


async def test_two_managers_never_both_find_the_schedule_free(
    engine: AsyncEngine, db_url: str
) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite: one manager (its writers are serialised)")
    targets = [HttpTarget(engine, HttpConfig()) for _ in range(4)]
    results = await asyncio.gather(
        *(
            t.enqueue([task("o.race", at(n), URL, overlap="hold")], at(5))
            for n, t in enumerate(targets)
        )
    )
    assert sorted(r.status for [r] in results) == ["busy", "busy", "busy", "enqueued"]
