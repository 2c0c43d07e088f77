"""A manager SIGKILLed while its deliveries are in flight and in retry: another manager (a real
process too) finishes them; every delivery reaches the receiver, which deduplicates, exactly
once; the requests sent twice are at most those that were open when it died (the per-host
limit) plus the outcomes of one instant not yet recorded."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from periodic_manager.db.engine import create_engine
from periodic_manager.db.models import http_deliveries_table as table
from periodic_manager.targets.http.config import HttpConfig
from periodic_manager.targets.http.target import HttpTarget
from tests.support import rawsql
from tests.support.polling import eventually
from tests.support.servers import ManagerProcess
from tests.targets.http_receiver import Answer, Received, Receiver
from tests.targets.test_http_target import task

PER_HOST = 4


async def slow_then_ok(r: Received) -> Answer:
    await asyncio.sleep(0.3)
    return (503, {}, b"busy") if r.headers.get("x-pm-attempt") == "1" else (200, {}, b"ok")


async def states(url: str) -> dict[str, str]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(select(table.c.idempotency_key, table.c.state))
            return {k: s for k, s in rows.all()}
    finally:
        await engine.dispose()


async def test_a_killed_managers_deliveries_are_finished_by_another(
    migrated_pg_url: str, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("PM_HTTP_ALLOW_PRIVATE", "true")
    url = migrated_pg_url
    receiver = Receiver(answer=slow_then_ok)
    await receiver.start()
    options = {"url": receiver.url, "timeout": 2, "retry": {"backoff": {"initial": 0.2, "max": 1}}}
    await rawsql.insert(url, "kill.every", spec="'@every 1s'", options=f"'{json.dumps(options)}'")
    engine = create_engine(url)
    try:  # a burst already due, as slots sent by a manager before
        now = datetime.now(UTC)
        policy = {k: v for k, v in options.items() if k != "url"}
        burst = [task(f"kill.b{i}", now, receiver.url, **policy) for i in range(40)]
        await HttpTarget(engine, HttpConfig(allow_private=True)).enqueue(burst, now)
    finally:
        await engine.dispose()
    env = {
        "PM_DATABASE_URL": url,
        "PM_TARGET": "http",
        "PM_HTTP_ALLOW_PRIVATE": "true",
        "PM_HTTP_CONCURRENCY_PER_HOST": str(PER_HOST),
        "PM_HTTP_LEASE_MARGIN": "1",
        "PM_HTTP_POLL_INTERVAL": "0.2",
        "PM_HEARTBEAT_INTERVAL": "1",
    }
    a = ManagerProcess(env, tmp_path / "a.log")
    b = ManagerProcess(env, tmp_path / "b.log")
    try:
        a.start()
        await eventually(
            lambda: len(receiver.requests) >= 30 and receiver.open_now >= 2,
            "the first manager delivers, requests open",
            seconds=60,
            detail=a.log,
        )
        open_at_kill = set(receiver.open_keys)
        a.kill()
        b.start()

        async def burst_done() -> bool:
            found = await states(url)
            return all(found.get(t.idempotency_key) == "done" for t in burst)

        await eventually(burst_done, "the burst delivered", seconds=90, detail=b.log)
        await rawsql.execute(url, "UPDATE periodic_jobs SET enabled = false")

        async def all_done() -> bool:
            return set((await states(url)).values()) == {"done"}

        await eventually(all_done, "every delivery done", seconds=60, detail=b.log)
        assert b.stop() == 0, b.log()[-3000:]
    finally:
        a.kill()
        b.stop()
        await receiver.stop()
    keys = set(await states(url))
    assert {t.idempotency_key for t in burst} <= keys
    assert sum(1 for k in keys if k.startswith("kill.every:")) >= 2  # the schedule's slots too
    assert receiver.processed == {k: 1 for k in keys}  # 0 lost, each processed once
    twice = {k: n for k, n in receiver.answered_ok.items() if n > 1}
    assert sum(n - 1 for n in twice.values()) <= 2 * PER_HOST, (twice, open_at_kill)
    print(
        f"\n2xx answered twice after the kill: {len(twice)} (open at the kill: {len(open_at_kill)})"
    )
