"""Step 15's options end to end, as a user runs them: one ``periodic-manager run`` process (API
and manager, PostgreSQL, Redis Streams), schedules and a calendar written over HTTP, and what
reaches the stream read from the stream itself, compared with the previews the API gave.

Real processes run on wall time (the one place tests do), so every schedule fires every second
or two and the process runs for a few seconds.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import redis.asyncio as aioredis

from periodic_manager.db.migrate import upgrade
from periodic_manager.schedules.definition import idempotency_key
from tests.support.browser import Server
from tests.support.polling import eventually

QUEUE = "rich"


def iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


async def sent(redis: aioredis.Redis, prefix: str) -> dict[str, list[tuple[datetime, str]]]:
    """(scheduled_at, idempotency key) of every message on the queue's stream, by schedule."""
    out: dict[str, list[tuple[datetime, str]]] = {}
    for _, fields in await redis.xrange(f"{{{prefix}:{QUEUE}}}:stream"):
        at = datetime.fromisoformat(fields["scheduled_at"])
        out.setdefault(fields["name"], []).append((at, fields["idempotency_key"]))
    return out


async def test_bounds_limits_jitter_and_calendars_in_a_running_process(
    pg_url: str, redis_url: str, redis_prefix: str, redis_client: aioredis.Redis
) -> None:
    await upgrade(pg_url)
    server = Server(
        pg_url,
        "run",
        PM_TARGET="redis",
        PM_REDIS_URL=redis_url,
        PM_STREAM_PREFIX=redis_prefix,
        PM_LOG_LEVEL="INFO",
        PM_HEARTBEAT_INTERVAL="1",
    )
    await asyncio.to_thread(server.start)
    try:
        async with httpx.AsyncClient(base_url=server.base, timeout=10) as api:
            today = datetime.now(UTC).date()
            put = await api.put(
                "/calendars/pm-today",
                json={"dates": [str(today), str(today + timedelta(days=1))]},
            )
            assert put.status_code in (200, 201), put.text
            now = datetime.now(UTC)
            common = {"task_type": "rich.task", "options": {"queue": QUEUE}}

            async def create(name: str, spec: str, **options: Any) -> dict[str, Any]:
                body = {**common, "name": name, "spec": spec}
                body["options"] = {**common["options"], **options}  # type: ignore[dict-item]
                resp = await api.post("/schedules", json=body)
                assert resp.status_code == 201, resp.text
                return dict(resp.json())

            limited = await create("rich.limited", "@every 1s", max_runs=3)
            bounded = await create(
                "rich.bounded",
                "@every 1s",
                start_at=iso(now + timedelta(seconds=2)),
                end_at=iso(now + timedelta(seconds=5)),
            )
            jittered = await create("rich.jittered", "@every 2s", jitter=1.5)
            excluded = await create("rich.excluded", "@every 1s", exclude=["pm-today"])
            # A bad option is refused, naming it; nothing is created.
            bad = await api.post(
                "/schedules",
                json={
                    **common,
                    "name": "rich.bad",
                    "spec": "@every 1s",
                    "options": {"exclude": ["no-such-calendar"]},
                },
            )
            assert bad.status_code == 422 and "options.exclude" in bad.text

            async def done() -> bool:
                # Six seconds past creation: the end of the bounded window (5 s) and of a fourth
                # run of the limited schedule (its slots are 1 s apart) are both behind.
                got = await sent(redis_client, redis_prefix)
                return (
                    len(got.get("rich.limited", [])) >= 3
                    and len(got.get("rich.jittered", [])) >= 3
                    and datetime.now(UTC) > now + timedelta(seconds=6)
                )

            await eventually(
                done, "three runs of the limited schedule", seconds=30, detail=server.output
            )
            got = await sent(redis_client, redis_prefix)
            limited_after = (await api.get(f"/schedules/{limited['id']}")).json()
            bounded_after = (await api.get(f"/schedules/{bounded['id']}")).json()
            excluded_runs = (await api.get(f"/schedules/{excluded['id']}/runs")).json()["items"]
            log = server.output()
    finally:
        await asyncio.to_thread(server.stop)

    # max_runs: exactly the three slots the API previewed at creation, and then "ended".
    runs = got["rich.limited"]
    assert [at for at, _ in runs] == [datetime.fromisoformat(s) for s in limited["next_runs"]]
    assert limited_after["runs_left"] == 0 and limited_after["status"] == "ended"
    # start_at/end_at: only slots in [start_at, end_at), previewed alike; then "ended".
    window = [at for at, _ in got["rich.bounded"]]
    assert window and all(
        now + timedelta(seconds=2) <= at < now + timedelta(seconds=5) for at in window
    )
    assert len(window) == len(set(window)) >= 2
    assert [datetime.fromisoformat(s) for s in bounded["next_runs"]] == window[
        : len(bounded["next_runs"])
    ]
    assert bounded_after["status"] == "ended"
    # jitter: sent late by up to 1.5 s, but scheduled_at and the key stay the nominal slot.
    for at, key in got["rich.jittered"]:
        assert at.microsecond == 0 and int(at.timestamp()) % 2 == 0
        assert key == idempotency_key("rich.jittered", at)
    assert [at for at, _ in got["rich.jittered"]][:3] == [
        datetime.fromisoformat(s) for s in jittered["next_runs"]
    ]
    # exclude: nothing sent on the calendar's dates, each slot recorded skipped: excluded.
    assert "rich.excluded" not in got
    assert excluded_runs and {(r["status"], r["error"].split(":")[0]) for r in excluded_runs} == {
        ("skipped", "excluded")
    }
    assert " ERROR " not in log, log
