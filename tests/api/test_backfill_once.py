"""Backfill exactly once, and remembered (issue 36, part 6), on PostgreSQL, SQLite and MariaDB
with the Redis Streams target, whose claims of a key live only a window (90 s in the field):
here a test deletes them (its own keys) to stand for their expiry.

* Two backfills of one range racing, one through the API app, one through the CLI's code path
  (``backfill_command``), at different rates on one virtual clock, claims expiring meanwhile:
  every slot reaches the stream once.
* A backfill while no manager runs, then Redis forgets everything and a manager starts with a
  ``misfire: all`` catch-up: the backfilled slots are settled, not sent again; nor by a second
  backfill of the range.
* The run history capped below the backfilled slots, claims gone: a second backfill sends none.
* A range older than what is remembered: counted ``unchecked``, sent only with ``force``.
* ``options.exclude`` and ``options.max_runs`` hold for a backfill as for a manager.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from periodic_manager.cli.files import backfill_command
from periodic_manager.clock import VirtualClock
from periodic_manager.db import history
from periodic_manager.db.migrate import upgrade
from periodic_manager.settings import Settings
from tests.support import rawsql
from tests.support.e2e import T0, Rig, at, e2e_rig, iso

URLS = {"postgresql": "pg_url", "sqlite": "sqlite_url", "mysql": "mariadb_url"}


@pytest.fixture(params=list(URLS))
def database(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(URLS[str(request.param)]))


@pytest.fixture
async def url(database: str, redis_client: aioredis.Redis) -> str:
    """A migrated database on each backend (Redis is the target throughout)."""
    await upgrade(database)
    return database


@asynccontextmanager
async def rig_at(
    url: str, prefix: str, redis_url: str, start: datetime, **overrides: Any
) -> AsyncIterator[Rig]:
    async for rig in e2e_rig(url, "redis", prefix, redis_url, start=start, **overrides):
        yield rig


def cli_settings(url: str, prefix: str, redis_url: str, rate: float) -> Settings:
    return Settings(
        database_url=url,
        target="redis",
        redis_url=redis_url,
        stream_prefix=prefix,
        grace=30,
        catchup_rate=rate,
    )


def cli_args(
    name: str, start: datetime, end: datetime, *, force: bool = False
) -> argparse.Namespace:
    return argparse.Namespace(name=name, from_=iso(start), to=iso(end), dry_run=False, force=force)


async def drive(
    clock: VirtualClock,
    calls: list[Awaitable[Any]],
    *,
    step: float = 0.1,
    advance: Callable[[datetime], Awaitable[None]] | None = None,
    every_step: Callable[[int], Awaitable[None]] | None = None,
) -> list[Any]:
    """Run ``calls`` while the virtual clock moves to the next sleeper's deadline, a ``step`` at
    most at a time (their paced batches); ``every_step(k)`` after step k. Bounded by 120 s of
    wall time."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    move = advance or clock.advance_to
    delta = timedelta(seconds=step)
    k = 0
    loop = asyncio.get_running_loop()
    until = loop.time() + 120
    while not all(t.done() for t in tasks):
        assert loop.time() < until, "the backfills did not end within 120 s"
        deadline = clock.next_deadline()
        if deadline is None:
            await asyncio.sleep(0.002)
            continue
        await move(min(deadline, clock.now() + delta))
        k += 1
        if every_step is not None:
            await every_step(k)
    return [t.result() for t in tasks]


async def forget_claims(redis: aioredis.Redis, prefix: str) -> int:
    """Delete the test's claims of keys in Redis (their TTL ran out, in the field)."""
    keys = [k async for k in redis.scan_iter(match=f"*{prefix}*:claim:*", count=1000)]
    if keys:
        await redis.delete(*keys)
    return len(keys)


async def forget_everything(redis: aioredis.Redis, prefix: str) -> None:
    keys = [k async for k in redis.scan_iter(match=f"*{prefix}*", count=1000)]
    if keys:
        await redis.delete(*keys)


def scheduled(messages: list[dict[str, Any]], name: str, before: datetime) -> Counter[str]:
    return Counter(
        m["scheduled_at"] for m in messages if m["name"] == name and m["scheduled_at"] < iso(before)
    )


async def create(rig: Rig, body: dict[str, Any]) -> int:
    r = await rig.client.post("/schedules", json={"task_type": "t", **body})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


async def test_two_racing_backfills_api_and_cli_send_each_slot_once(
    url: str,
    redis_prefix: str,
    redis_url: str,
    redis_client: aioredis.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with rig_at(url, redis_prefix, redis_url, T0, catchup_rate=20) as rig:
        sid = await create(rig, {"name": "race", "spec": "* * * * *"})
        start, end = at(10, 0), at(12, 0)  # 120 slots, all before the row was created
        api = rig.client.post(
            f"/schedules/{sid}/backfill", json={"from": iso(start), "to": iso(end)}
        )
        cli = backfill_command(
            cli_args("race", start, end),
            cli_settings(url, redis_prefix, redis_url, 5),
            clock=rig.clock,
        )

        async def expire(k: int) -> None:
            if k % 5 == 0:  # every half second of the race, the claims of the broker run out
                await forget_claims(redis_client, redis_prefix)

        answer, status = await drive(
            rig.clock, [api, cli], advance=rig.advance_to, every_step=expire
        )
        assert answer.status_code == 200, answer.text
        assert status == 0
        got = scheduled(await rig.messages(), "race", end)
        assert len(got) == 120 and set(got.values()) == {1}, [s for s, n in got.items() if n > 1]
        body = answer.json()
        [line] = capsys.readouterr().out.splitlines()
        by_cli = int(line.split(": ")[1].split(" sent")[0])
        assert body["slots"] == 120 and body["sent"] + by_cli == 120, (body, line)


async def test_backfilled_slots_are_settled_and_not_sent_again_after_redis_forgot(
    url: str, redis_prefix: str, redis_url: str, redis_client: aioredis.Redis
) -> None:
    async with rig_at(url, redis_prefix, redis_url, T0) as rig:
        sid = await create(rig, {"name": "gap", "spec": "* * * * *", "options": {"misfire": "all"}})
        await rig.advance_to(at(12, 3, 30))  # 12:01-12:03 sent; then no manager runs
    clock = VirtualClock(at(12, 10) + timedelta(seconds=0.2))
    settings = cli_settings(url, redis_prefix, redis_url, 50)
    [status] = await drive(
        clock, [backfill_command(cli_args("gap", at(12, 4), at(12, 10)), settings, clock)]
    )
    assert status == 0
    await forget_everything(redis_client, redis_prefix)  # the broker lost its data
    async with rig_at(url, redis_prefix, redis_url, at(12, 10, 0) + timedelta(seconds=0.5)) as rig:
        await rig.advance_to(at(12, 10, 5))  # the start's catch-up (misfire: all) is done
        assert await rig.slots("gap") == [iso(at(12, 10))]  # 12:04-12:09 were settled
        rng = {"from": iso(at(12, 0)), "to": iso(at(12, 10))}
        [r] = await drive(
            rig.clock,
            [rig.client.post(f"/schedules/{sid}/backfill", json=rng)],
            advance=rig.advance_to,
        )
        assert r.status_code == 200, r.text
        assert (r.json()["sent"], r.json()["already_sent"]) == (1, 9), r.json()  # 12:00 only
        assert await rig.slots("gap") == [iso(at(12, 10)), iso(at(12, 0))]


async def test_a_backfill_after_the_history_was_capped_sends_nothing_again(
    url: str, redis_prefix: str, redis_url: str, redis_client: aioredis.Redis
) -> None:
    async with rig_at(url, redis_prefix, redis_url, T0, catchup_rate=100) as rig:
        sid = await create(rig, {"name": "cap", "spec": "* * * * *"})
        rng = {"from": iso(at(11, 0)), "to": iso(at(11, 30))}
        [first] = await drive(
            rig.clock,
            [rig.client.post(f"/schedules/{sid}/backfill", json=rng)],
            advance=rig.advance_to,
        )
        assert first.json()["sent"] == 30, first.text
        assert (
            await history.cap(rig.engine, [str(sid)], 5) == 25
        )  # PM_RUNS_MAX_PER_SCHEDULE at work
        await forget_claims(redis_client, redis_prefix)
        [again] = await drive(
            rig.clock,
            [rig.client.post(f"/schedules/{sid}/backfill", json=rng)],
            advance=rig.advance_to,
        )
        assert (again.json()["sent"], again.json()["already_sent"], again.json()["unchecked"]) == (
            0,
            30,
            0,
        )
        assert len(scheduled(await rig.messages(), "cap", at(12, 0))) == 30
        assert sum(scheduled(await rig.messages(), "cap", at(12, 0)).values()) == 30


async def test_a_range_older_than_what_is_remembered_is_counted_and_sent_only_with_force(
    url: str, redis_prefix: str, redis_url: str
) -> None:
    async with rig_at(url, redis_prefix, redis_url, T0, catchup_rate=100) as rig:
        sid = await create(rig, {"name": "old", "spec": "@hourly"})
        # A row older than the retention (7 days): whatever was sent of it before is forgotten.
        old = rawsql.instant(url, "2024-01-01T00:00:00")
        await rawsql.execute(url, f"UPDATE periodic_jobs SET created_at = {old} WHERE id = {sid}")
        rng = {"from": "2024-04-20T00:00:00Z", "to": "2024-04-20T05:00:00Z"}
        recent = {"from": iso(at(6, 0)), "to": iso(at(9, 0))}  # within the retention
        [r, fresh] = await drive(
            rig.clock,
            [
                rig.client.post(f"/schedules/{sid}/backfill", json=rng),
                rig.client.post(f"/schedules/{sid}/backfill", json=recent),
            ],
            advance=rig.advance_to,
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["slots"], body["unchecked"], body["to_send"], body["sent"]) == (5, 5, 0, 0), (
            body
        )
        assert (fresh.json()["sent"], fresh.json()["unchecked"]) == (3, 0), fresh.text
        assert scheduled(await rig.messages(), "old", at(0, 0)) == {}
        [forced] = await drive(
            rig.clock,
            [rig.client.post(f"/schedules/{sid}/backfill", json={**rng, "force": True})],
            advance=rig.advance_to,
        )
        body = forced.json()
        assert (body["unchecked"], body["sent"], body["forced"]) == (5, 5, True), body
        assert sum(scheduled(await rig.messages(), "old", at(0, 0)).values()) == 5


async def test_a_backfill_obeys_exclude_and_max_runs(
    url: str, redis_prefix: str, redis_url: str
) -> None:
    async with rig_at(url, redis_prefix, redis_url, T0, catchup_rate=100) as rig:
        r = await rig.client.put("/calendars/holiday", json={"dates": ["2024-04-30"]})
        assert r.status_code in (200, 201), r.text
        ex = await create(
            rig, {"name": "ex", "spec": "@hourly", "options": {"exclude": ["holiday"]}}
        )
        lim = await create(rig, {"name": "lim", "spec": "* * * * *", "options": {"max_runs": 3}})
        on_holiday = {"from": "2024-04-29T22:00:00Z", "to": "2024-05-01T00:00:00Z"}
        first = {"from": iso(at(11, 0)), "to": iso(at(11, 30))}
        [a, b] = await drive(
            rig.clock,
            [
                rig.client.post(f"/schedules/{ex}/backfill", json=on_holiday),
                rig.client.post(f"/schedules/{lim}/backfill", json=first),
            ],
            advance=rig.advance_to,
        )
        assert (a.json()["slots"], a.json()["excluded"], a.json()["sent"]) == (26, 24, 2), a.text
        assert (b.json()["sent"], b.json()["over_limit"]) == (3, 27), b.text
        messages = await rig.messages()
        assert sorted(scheduled(messages, "ex", at(12, 0))) == [
            "2024-04-29T22:00:00Z",
            "2024-04-29T23:00:00Z",
        ]
        assert sorted(scheduled(messages, "lim", at(12, 0))) == [iso(at(11, m)) for m in range(3)]
        [c] = await drive(
            rig.clock,
            [
                rig.client.post(
                    f"/schedules/{lim}/backfill",
                    json={"from": iso(at(10, 0)), "to": iso(at(11, 0))},
                )
            ],
            advance=rig.advance_to,
        )
        assert (c.json()["sent"], c.json()["over_limit"]) == (0, 60), c.text
        state = await rawsql.execute(
            url, f"SELECT runs_count FROM pm_schedule_state WHERE schedule_key = '{lim}'"
        )
        assert [int(v) for (v,) in state] == [3]
