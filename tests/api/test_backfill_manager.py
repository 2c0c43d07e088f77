"""misfire "all" and backfill through a real manager (in the API's process; the outbox on
PostgreSQL and SQLite, Redis Streams on PostgreSQL) on a VirtualClock: after an outage every missed slot reaches the outbox once,
oldest first, at the paced rate (by virtual instants), none before effective_at; a backfill sends
every slot of its range never sent, with its nominal scheduled_at and key, paced, counts what was
already sent, sends nothing the second time or in a dry run, and refuses bad ranges naming the
field (tests/cli/test_cli_backfill.py runs the CLI)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest

from periodic_manager.db.migrate import upgrade
from tests.runtime.test_last_good import running
from tests.support import rawsql
from tests.support.e2e import T0, Rig, at, e2e_rig, iso
from tests.support.polling import eventually

RATE = 10  # one slot every 0.1 s
# A backfill's answer with every count 0.
NOTHING = {
    "slots": 0,
    "excluded": 0,
    "already_sent": 0,
    "unchecked": 0,
    "to_send": 0,
    "sent": 0,
    "over_limit": 0,
    "skipped": 0,
    "failed": 0,
    "dry_run": False,
    "forced": False,
}


@pytest.fixture(params=["postgresql+redis", "postgresql+outbox", "sqlite+outbox"])
def combo(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(database URL, target); the Redis case cleans its keys afterwards."""
    backend, target = str(request.param).split("+")
    if target == "redis":
        request.getfixturevalue("redis_client")
    return str(
        request.getfixturevalue("pg_url" if backend == "postgresql" else "sqlite_url")
    ), target


@pytest.fixture
async def make(combo: tuple[str, str], redis_prefix: str, redis_url: str) -> Any:
    """``make(start)``: a rig (API and manager on the combo's database and target) from
    ``start``; each one a process that starts and ends, on one database and one broker."""
    url, target = combo
    await upgrade(url)

    @asynccontextmanager
    async def rig_at(start: datetime) -> AsyncIterator[Rig]:
        async for rig in e2e_rig(
            url, target, redis_prefix, redis_url, start=start, catchup_rate=RATE
        ):
            yield rig

    rig_at.url = url  # type: ignore[attr-defined]
    return rig_at


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def half(h: int, m: int) -> datetime:
    return at(h, m) + timedelta(microseconds=500000)


async def paced_steps(rig: Rig, start: datetime, n: int) -> None:
    """Move the clock one pacing step (1 / RATE s) at a time from ``start`` until ``n`` tasks
    sent since ``start`` are in the outbox: each step waits (bounded) for its task, written by
    the database between two virtual instants, so no step is passed before its send."""

    async def since() -> int:
        return len([m for m in await rig.messages() if instant(m["enqueued_at"]) >= start])

    for k in range(n):
        await rig.advance_to(start + timedelta(seconds=k / RATE))

        async def sent(k: int = k) -> bool:
            return await since() >= k + 1

        await eventually(sent, f"paced task {k + 1} of {n} in the outbox")


async def test_misfire_all_sends_every_missed_slot_oldest_first_at_the_paced_rate(
    make: Any,
) -> None:
    async with make(T0) as rig:
        r = await rig.client.post(
            "/schedules",
            json={
                "name": "a",
                "spec": "* * * * *",
                "task_type": "t",
                "options": {"misfire": "all"},
            },
        )
        assert r.status_code == 201, r.text
        await rig.advance_to(at(12, 3, 30))
        assert await rig.slots("a") == [iso(at(12, m)) for m in (1, 2, 3)]
    # Every manager down; a schedule created meanwhile exists from 12:10:00.5 on.
    async with running(make.url, half(12, 10), manager=False) as api:
        r = await api.client.post(
            "/schedules",
            json={
                "name": "b",
                "spec": "* * * * *",
                "task_type": "t",
                "options": {"misfire": "all"},
            },
        )
        assert r.status_code == 201, r.text
    async with make(half(12, 20)) as rig:
        await paced_steps(rig, half(12, 20), 27)
        messages = [m for m in await rig.messages() if instant(m["enqueued_at"]) >= half(12, 20)]
        expected = sorted(
            [("a", at(12, m)) for m in range(4, 21)] + [("b", at(12, m)) for m in range(11, 21)],
            key=lambda x: (x[1], x[0]),
        )
        got = [(m["name"], instant(m["scheduled_at"])) for m in messages]
        assert (
            sorted(got, key=lambda x: (x[1], x[0])) == expected
        )  # each once, none before effective_at
        assert [s for _, s in got] == sorted(s for _, s in got)  # oldest first
        assert [instant(m["enqueued_at"]) for m in messages] == [
            half(12, 20) + timedelta(seconds=k / RATE) for k in range(len(expected))
        ]
        assert all(m["idempotency_key"] == f"{m['name']}:{m['scheduled_at']}" for m in messages)
        assert await rig.slots("a") == [
            iso(at(12, m)) for m in range(1, 21)
        ]  # 12:01-12:03 not again


async def backfill(rig: Rig, sid: int, body: dict[str, Any], n: int) -> Any:
    """POST the backfill while the virtual clock moves on, a pacing step per task (``n``)."""
    start = rig.clock.now()
    call = asyncio.ensure_future(rig.client.post(f"/schedules/{sid}/backfill", json=body))
    await paced_steps(rig, start, n)
    await rig.advance_to(start + timedelta(seconds=n / RATE))  # the pace's last step ends it
    return await asyncio.wait_for(call, 30)


async def answered(rig: Rig, request: Any) -> Any:
    """Await ``request`` while the clock moves a pacing step whenever a sleeper is due within
    one (the pace's next batch; how many batches it takes is not known in advance)."""
    call = asyncio.ensure_future(request)
    step = timedelta(seconds=1 / RATE)
    for _ in range(10_000):
        if call.done():
            break

        def due() -> bool:
            at = rig.clock.next_deadline()
            return call.done() or (at is not None and at <= rig.clock.now() + step)

        await eventually(due, "the backfill's next pacing step or its answer")
        if not call.done():
            await rig.advance_to(rig.clock.now() + step)
    return await asyncio.wait_for(call, 30)


async def test_backfill_sends_each_never_sent_slot_once_with_its_nominal_slot(make: Any) -> None:
    async with make(T0) as rig:
        r = await rig.client.post(
            "/schedules", json={"name": "bf", "spec": "* * * * *", "task_type": "t"}
        )
        sid = r.json()["id"]
        await rig.advance_to(at(12, 3, 30))
    async with make(half(12, 10)) as rig:  # 12:04-12:10 missed
        rng = {"from": iso(at(12, 0)), "to": iso(at(12, 10))}
        r = await rig.client.post(f"/schedules/{sid}/backfill", json={**rng, "dry_run": True})
        assert r.status_code == 200, r.text
        assert r.json() == {
            **NOTHING,
            "slots": 10,
            "already_sent": 3,
            "to_send": 7,
            "dry_run": True,
        }
        assert await rig.slots("bf") == [
            iso(at(12, m)) for m in (1, 2, 3)
        ]  # the dry run sent nothing
        r = await backfill(rig, sid, rng, 7)
        assert r.status_code == 200, r.text
        assert r.json() == {**NOTHING, "slots": 10, "already_sent": 3, "to_send": 7, "sent": 7}
        mine = [m for m in await rig.messages() if m["name"] == "bf"]
        assert sorted(m["scheduled_at"] for m in mine) == [iso(at(12, m)) for m in range(0, 10)]
        filled = mine[3:]
        assert [m["scheduled_at"] for m in filled] == [
            iso(at(12, m)) for m in (0, 4, 5, 6, 7, 8, 9)
        ]
        assert all(m["idempotency_key"] == f"bf:{m['scheduled_at']}" for m in filled)
        assert [instant(m["enqueued_at"]) for m in filled] == [
            half(12, 10) + timedelta(seconds=k / RATE) for k in range(7)
        ]
        runs = (
            await rig.client.get(f"/schedules/{sid}/runs", params={"status": "backfilled"})
        ).json()
        assert sorted(r["slot_at"] for r in runs["items"]) == [
            iso(at(12, m)) for m in (0, 4, 5, 6, 7, 8, 9)
        ]
        again = await backfill(rig, sid, rng, 0)
        assert again.json()["sent"] == 0 and again.json()["already_sent"] == 10
        assert len([m for m in await rig.messages() if m["name"] == "bf"]) == 10
        # With the history and state gone (pruned), the backfill records still know the 7 it
        # sent; the 3 live ones only the target's claims (the outbox keeps its rows' keys,
        # Redis its claims while they live).
        await rawsql.execute(make.url, f"DELETE FROM pm_runs WHERE schedule_key = '{sid}'")
        await rawsql.execute(
            make.url, f"DELETE FROM pm_schedule_state WHERE schedule_key = '{sid}'"
        )
        third = (
            await answered(rig, rig.client.post(f"/schedules/{sid}/backfill", json=rng))
        ).json()
        assert (third["to_send"], third["sent"] + third["already_sent"]) == (3, 10), third
        if rig.settings.target == "outbox":
            assert third["sent"] == 0
        sent = [m["scheduled_at"] for m in await rig.messages() if m["name"] == "bf"]
        assert len(sent) == 10 + third["sent"]


async def test_backfill_refuses_bad_ranges_naming_the_field_and_a_paused_schedule(
    db_url: str,
) -> None:
    async with running(db_url, T0, manager=False) as rig:
        sid = (
            await rig.client.post(
                "/schedules", json={"name": "x", "spec": "@every 1s", "task_type": "t"}
            )
        ).json()["id"]
        cases = [
            ({"from": "yesterday", "to": iso(at(11, 0))}, "from"),
            ({"from": iso(at(10, 0)), "to": "2024-05-01T11:00:00"}, "to"),  # naive
            ({"from": iso(at(11, 0)), "to": iso(at(11, 0))}, "to"),  # from >= to
            ({"from": iso(at(11, 0)), "to": iso(at(12, 5))}, "to"),  # after now
            ({"from": "2024-04-01T00:00:00Z", "to": iso(at(11, 0))}, "to"),  # > 100,000 slots
            ({"from": 5, "to": iso(at(11, 0))}, "from"),
        ]
        for body, field in cases:
            r = await rig.client.post(f"/schedules/{sid}/backfill", json=body)
            assert r.status_code == 422, (body, r.text)
            assert r.json()["errors"][0]["field"] == field, (body, r.json())
        r = await rig.client.post(f"/schedules/{sid}/backfill", json={"to": iso(at(11, 0))})
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "from", r.text
        assert (await rig.client.post(f"/schedules/{sid}/pause")).status_code == 200
        r = await rig.client.post(
            f"/schedules/{sid}/backfill", json={"from": iso(at(11, 0)), "to": iso(at(11, 1))}
        )
        assert r.status_code == 409 and "paused" in r.text, r.text
        r = await rig.client.post(
            "/schedules/999999/backfill", json={"from": iso(at(11, 0)), "to": iso(at(11, 1))}
        )
        assert r.status_code == 404


async def test_misfire_all_is_judged_like_every_option(db_url: str) -> None:
    """Kept by the API, refused naming options.misfire, a row error when written with SQL."""
    async with running(db_url, T0) as rig:
        job = {"name": "ok", "spec": "@hourly", "task_type": "t", "options": {"misfire": "all"}}
        r = await rig.client.post("/schedules", json=job)
        assert r.status_code == 201 and r.json()["options"] == {"misfire": "all"}, r.text
        r = await rig.client.post(
            "/schedules", json={**job, "name": "bad", "options": {"misfire": "every"}}
        )
        assert r.status_code == 422, r.text
        [err] = r.json()["errors"]
        assert err["field"] == "options.misfire" and "skip, fire_once, all" in err["reason"]
        sid = await rawsql.insert(db_url, "by.sql", options="""'{"misfire": "alll"}'""")
        await rig.advance_to(at(12, 0, 31))  # the sync at 12:00:30 reads it
        body = (await rig.client.get(f"/schedules/{sid}")).json()
        assert body["status"] == "error" and body["errors"][0]["field"] == "options.misfire", body
