"""The deliverer on every backend (PostgreSQL, SQLite, MariaDB: its claim, its lease, its
outcomes), against a real receiver: a burst retried through errors is delivered, each key
processed once, and the metric counts what happened."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.clock import VirtualClock
from periodic_manager.db.engine import create_engine
from tests.targets.http_receiver import Received, Receiver
from tests.targets.test_http_target import FAST, START, Delivering, all_in, task, until


@pytest.fixture(autouse=True)
def _private_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PM_HTTP_ALLOW_PRIVATE", "true")


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    e = create_engine(db_url)
    yield e
    await e.dispose()


async def test_a_burst_through_errors_is_delivered_once_each(engine: AsyncEngine) -> None:
    seen: Counter[str] = Counter()

    def flaky(r: Received) -> tuple[int, dict[str, str], bytes]:
        key = r.headers["idempotency-key"]
        seen[key] += 1
        return (500, {}, b"") if seen[key] == 1 else (200, {}, b"ok")

    receiver = Receiver(answer=flaky)
    await receiver.start()
    try:
        clock = VirtualClock(START)
        d = Delivering(engine, clock, "m1", concurrency_per_host=3)
        tasks = [task(f"b.s{i}", START, receiver.url, retry=FAST) for i in range(30)]
        await d.target.enqueue(tasks, clock.now())
        await until(clock, lambda: all_in(engine, "done", 30), step=0.5)
        await d.stop()
    finally:
        await receiver.stop()
    assert receiver.processed == {t.idempotency_key: 1 for t in tasks}
    assert receiver.most_open <= 3
    assert d.target.delivery_counts() == {"done": 30, "retried": 30, "dead": 0}
