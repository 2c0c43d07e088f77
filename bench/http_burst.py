"""A burst of 10,000 slots to one HTTP receiver through the http target, against what the
receiver alone takes at the same concurrency.

    .venv/bin/python bench/http_burst.py [--slots 10000] [--per-host 16] [--service-ms 2]

The receiver is a separate process (uvicorn, one worker) that answers each request after
``--service-ms`` and deduplicates by Idempotency-Key. First the receiver alone: ``--slots``
requests of the same body from an httpx client with ``--per-host`` requests open at once (the
best any sender can do at that concurrency). Then the target: the slots enqueued in one batch
(rows of ``pm_http_deliveries`` in a fresh PostgreSQL database), and one deliverer (as a manager
runs it, ``PM_HTTP_CONCURRENCY_PER_HOST=--per-host``) sends them all; timed from its start to
the last row done. Prints a markdown table; the goal is a ratio of at most 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
from sqlalchemy import func, select  # noqa: E402

from periodic_manager.clock import SystemClock  # noqa: E402
from periodic_manager.contracts import Task  # noqa: E402
from periodic_manager.db.engine import create_engine  # noqa: E402
from periodic_manager.db.models import http_deliveries_table as table  # noqa: E402
from periodic_manager.targets.base import task_id_for  # noqa: E402
from periodic_manager.targets.http.config import HttpConfig  # noqa: E402
from periodic_manager.targets.http.target import HttpTarget  # noqa: E402
from tests.conftest import new_pg_database  # noqa: E402


class Receiver:
    """Answers 200 after the service time; counts keys processed (once each) and requests."""

    def __init__(self, service_s: float) -> None:
        self.service_s = service_s
        self.keys: set[str] = set()
        self.requests = 0
        self.open = 0
        self.most_open = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        if scope["path"] == "/stats":
            stats = {"keys": len(self.keys), "requests": self.requests, "most_open": self.most_open}
            body = json.dumps(stats).encode()
        else:
            self.requests += 1
            self.open += 1
            self.most_open = max(self.most_open, self.open)
            await asyncio.sleep(self.service_s)
            self.open -= 1
            for k, v in scope["headers"]:
                if k == b"idempotency-key":
                    self.keys.add(v.decode())
            body = b"ok"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


def serve(port: int, service_s: float) -> None:
    import uvicorn

    uvicorn.run(
        Receiver(service_s),
        host="127.0.0.1",
        port=port,
        log_level="error",
        lifespan="off",
        timeout_keep_alive=60,
    )


async def stats(base: str) -> dict[str, int]:
    async with httpx.AsyncClient() as client:
        found: dict[str, int] = (await client.get(f"{base}/stats")).json()
        return found


async def receiver_alone(url: str, slots: int, per_host: int) -> tuple[float, int]:
    """Seconds to send ``slots`` requests, ``per_host`` open at once; and how many were sent
    again after an error of the connection (as any sender must)."""
    gate = asyncio.Semaphore(per_host)
    again = 0
    body = json.dumps({"schedule": "b", "scheduled_at": "x", "task_type": "t", "payload": {}})
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=None)) as client:

        async def one(i: int) -> None:
            nonlocal again
            async with gate:
                for _ in range(5):
                    try:
                        r = await client.post(
                            url, content=body, headers={"Idempotency-Key": f"alone:{i}"}
                        )
                        r.raise_for_status()
                        return
                    except httpx.TransportError:
                        again += 1
                raise RuntimeError("the receiver failed 5 times")

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(slots)))
        return time.perf_counter() - started, again


async def through_target(db: str, url: str, slots: int, per_host: int) -> tuple[float, float]:
    engine = create_engine(db)
    target = HttpTarget(engine, HttpConfig(concurrency_per_host=per_host, allow_private=True))
    now = datetime.now(UTC)
    tasks = []
    for i in range(slots):
        slot = now - timedelta(seconds=i)
        key = f"burst.s{i % 100}:{slot.isoformat()}"
        tasks.append(
            Task(task_id_for(key), f"burst.s{i % 100}", "t", {}, "default",
                 {"url": url}, key, slot, slot + timedelta(seconds=30))
        )  # fmt: skip
    started = time.perf_counter()
    results = await target.enqueue(tasks, now)
    enqueued = time.perf_counter() - started
    assert all(r.status == "enqueued" for r in results), results[:3]
    delivering = asyncio.ensure_future(target.run_beside(SystemClock(), "bench"))
    started = time.perf_counter()
    try:
        while True:
            async with engine.connect() as conn:
                done = (
                    await conn.execute(
                        select(func.count()).select_from(table).where(table.c.state == "done")
                    )
                ).scalar()
            if done == slots:
                break
            await asyncio.sleep(0.05)
        took = time.perf_counter() - started
    finally:
        delivering.cancel()
        await asyncio.gather(delivering, return_exceptions=True)
        await engine.dispose()
    return enqueued, took


async def main(slots: int, per_host: int, service_ms: float) -> None:
    import os

    os.environ["PM_HTTP_ALLOW_PRIVATE"] = "true"  # the receiver is on 127.0.0.1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = multiprocessing.get_context("spawn").Process(
        target=serve, args=(port, service_ms / 1000), daemon=True
    )
    proc.start()
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                await stats(base)
                break
            except httpx.HTTPError:
                await asyncio.sleep(0.05)
        alone, again = await receiver_alone(f"{base}/alone", slots, per_host)
        async with new_pg_database(migrated=True) as db:
            enqueued, took = await through_target(db, f"{base}/hook", slots, per_host)
        seen = await stats(base)
    finally:
        proc.terminate()
        proc.join(10)
    keys = seen["keys"] - slots  # the receiver-alone keys are counted too
    print(f"{slots} slots to one receiver (service time {service_ms:g} ms), {per_host} per host\n")
    print("| | seconds | per second |")
    print("| --- | --- | --- |")
    print(f"| receiver alone (httpx, {per_host} open) | {alone:.2f} | {slots / alone:.0f} |")
    print(
        f"| http target: enqueue (one batch, PostgreSQL) | {enqueued:.2f} | {slots / enqueued:.0f} |"
    )
    print(f"| http target: deliver all | {took:.2f} | {slots / took:.0f} |")
    print(f"\nrequests the receiver-alone client sent again after a connection error: {again}")
    print(f"ratio deliver / receiver alone: {took / alone:.2f} (goal: at most 2)")
    print(f"keys processed by the receiver through the target: {keys} of {slots}")
    print(f"requests open at once at the receiver, at most: {seen['most_open']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--slots", type=int, default=10_000)
    parser.add_argument("--per-host", type=int, default=16)
    parser.add_argument("--service-ms", type=float, default=2.0)
    args = parser.parse_args()
    asyncio.run(main(args.slots, args.per_host, args.service_ms))
