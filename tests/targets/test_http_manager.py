"""The http target inside a running manager (the API's, in process, on a VirtualClock): the
scheduler's slots become deliveries its deliverer sends; ``options.pause_after_failures`` counts
the deliveries that ended as dead letters and pauses the schedule; ``options.overlap: skip``
skips a slot while the previous delivery is pending."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import select

from periodic_manager.db.engine import create_engine
from periodic_manager.db.models import http_deliveries_table as table
from periodic_manager.settings import Settings
from tests.api.test_pause_on_failure import until_paused
from tests.support.celery_arq_rig import api_rig, at
from tests.support.polling import eventually
from tests.targets.http_receiver import Answer, Received, Receiver


@pytest.fixture(autouse=True)
def _private_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PM_HTTP_ALLOW_PRIVATE", "true")  # the API's write-time rule


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver()
    await r.start()
    yield r
    await r.stop()


def settings(url: str) -> Settings:
    return Settings(
        database_url=url,
        target="http",
        http_allow_private=True,
        grace=30,
        heartbeat_interval=5,
        sync_interval=30,
    )


async def states(url: str) -> list[tuple[str, str]]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                select(table.c.idempotency_key, table.c.state).order_by(table.c.id)
            )
            return [(k, s) for k, s in rows.all()]
    finally:
        await engine.dispose()


async def test_dead_deliveries_pause_the_schedule(pg_url: str, receiver: Receiver) -> None:
    receiver.answer = lambda r: (410, {}, b"this hook is gone")
    options = {"url": receiver.url, "pause_after_failures": 2}
    async with api_rig(pg_url, settings(pg_url)) as rig:
        sid = (await rig.create(name="hook.gone", task_type="t", options=options))["id"]
        for minute in (1, 2):
            await rig.advance_to(at(12, minute, 30))

            async def dead(n: int = minute) -> bool:
                return [s for _, s in await states(pg_url)] == ["dead"] * n

            await eventually(dead, f"slot 12:0{minute} a dead letter", seconds=20)
        paused = await until_paused(rig, sid, at(12, 3, 10))
        assert paused is not None, "not paused after two dead letters"
        assert paused["paused"]["by"] == "manager"
        assert "2 consecutive failed tasks" in paused["paused"]["note"]
    assert [k for k, _ in await states(pg_url)] == [
        "hook.gone:2024-05-01T12:01:00Z",
        "hook.gone:2024-05-01T12:02:00Z",
    ]
    assert len(receiver.requests) == 2


async def test_overlap_skip_waits_for_the_receivers_2xx(pg_url: str, receiver: Receiver) -> None:
    answered = {"ok": False}

    def answer(r: Received) -> Answer:
        return (200, {}, b"ok") if answered["ok"] else (503, {}, b"busy")

    receiver.answer = answer
    retry = {"backoff": {"initial": 600, "max": 600}}  # the first stays pending for minutes
    options = {"url": receiver.url, "overlap": "skip", "retry": retry}
    async with api_rig(pg_url, settings(pg_url)) as rig:
        sid = (await rig.create(name="hook.slow", task_type="t", options=options))["id"]
        await rig.advance_to(at(12, 1, 30))
        await eventually(lambda: len(receiver.requests) == 1, "the first request", seconds=20)
        await rig.advance_to(at(12, 2, 30))  # the first is pending: 12:02 is skipped
        runs = (await rig.client.get(f"/schedules/{sid}/runs")).json()["items"]
        assert [r["status"] for r in runs][:2] == ["skipped", "enqueued"], runs
        answered["ok"] = True
        await rig.advance_to(at(12, 12, 30))  # the retry answered 2xx: the schedule is free
        await eventually(
            lambda: len([r for r in receiver.requests if r.headers["x-pm-attempt"] == "2"]) >= 1,
            "the retry",
            seconds=20,
        )
    keys = [k for k, _ in await states(pg_url)]
    assert "hook.slow:2024-05-01T12:02:00Z" not in keys
    assert keys[0] == "hook.slow:2024-05-01T12:01:00Z" and len(keys) >= 2
