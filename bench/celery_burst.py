"""A burst of Celery tasks due at one instant: written to Redis by the manager, or sent with kombu.

    .venv/bin/python bench/celery_burst.py [--n 10000] [--runs 5] [--no-worker]

Every row sends N tasks due at one instant into one Celery queue on the local Redis
(PM_BENCH_REDIS_URL) and measures, from Redis itself, the time from the slot to the first and to
the last message in the queue's list: a separate process polls LLEN every 1 ms (no MONITOR),
so the figures are when the messages were visible to a worker (to within ~1 ms). Rows:

- target, written, staged: ``prepare`` (messages, routes, script arguments) before the slot,
  only ``send`` (the script calls) at the slot: what the scheduler does.
- target, written, at the slot: ``enqueue`` (prepare + send) called at the slot (a retry, or a
  batch that could not be staged).
- target, kombu: ``send_task`` for every task, as 4 sub-batches in flight at once (the
  scheduler's sub-batches of 2,500 for N = 10,000).
- manager + target: a real PeriodicTaskManager (SystemClock, schedules from a StaticProvider, the
  in-memory run store) with N schedules due at one instant; its scheduler stages the instant's
  sub-batches (``prepare``) before the slot and sends them at it.

Then (unless --no-worker) a real Celery worker (prefork, 2 processes) drains one written burst:
every task must run exactly once, with its task id. Creates and deletes its own Redis keys.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from periodic_manager.clock import SystemClock  # noqa: E402
from periodic_manager.contracts import Task  # noqa: E402
from periodic_manager.providers import StaticProvider  # noqa: E402
from periodic_manager.runtime.manager import PeriodicTaskManager  # noqa: E402
from periodic_manager.runtime.timing import Timing  # noqa: E402
from periodic_manager.schedules.definition import PeriodicTaskConfig, idempotency_key  # noqa: E402
from periodic_manager.targets.base import task_for  # noqa: E402
from periodic_manager.targets.celery.target import CeleryTarget  # noqa: E402

REDIS = os.environ.get("PM_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
SUB_BATCHES = 4

POLLER = r"""
import json, sys, time, redis
url, key, n, until = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
client = redis.Redis.from_url(url)
first = last = None
print("ready", flush=True)
while time.time() < until:
    size = client.llen(key)
    seen = time.time()
    if size and first is None:
        first = seen
    if size >= n:
        last = seen
        break
    time.sleep(0.001)
print(json.dumps({"first": first, "last": last, "size": client.llen(key)}), flush=True)
"""


class Poller:
    """A process that watches LLEN of ``key`` until it reaches ``n`` (or ``until``, epoch s)."""

    def __init__(self, key: str, n: int, until: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", POLLER, REDIS, key, str(n), str(until)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"

    async def result(self) -> dict[str, Any]:
        """Wait for the verdict in a thread: the manager under test shares this event loop."""
        out, _ = await asyncio.to_thread(self.proc.communicate, timeout=300)
        return dict(json.loads(out))


def machine() -> str:
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    rs = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True
    ).stdout.split()[2]
    import celery
    import kombu

    return (
        f"{os.cpu_count()} cores, {cpu}; Python {platform.python_version()}; Redis {rs}; "
        f"Celery {celery.__version__}, kombu {kombu.__version__}; load average at start "
        f"{os.getloadavg()[0]:.2f}"
    )


def make_target(prefix: str, *, direct: bool) -> CeleryTarget:
    config = {"broker_transport_options": {"global_keyprefix": f"{prefix}:"}}
    target = CeleryTarget.from_url(REDIS, prefix=prefix, config=config, fast_path=direct)
    assert (target.writer is not None) is direct
    return target


def configs(n: int, queue: str, anchor: datetime | None = None) -> list[PeriodicTaskConfig]:
    """N schedules firing together: every hour from ``anchor`` (its first slot is ``anchor``)."""
    return [
        PeriodicTaskConfig.create(
            name=f"job{i}",
            spec="@every 1h",
            task_type="pmtest.record",
            payload={"n": i},
            options={"queue": queue},
            anchor=anchor,
        )
        for i in range(n)
    ]


def burst(cfgs: list[PeriodicTaskConfig], slot: datetime) -> list[Task]:
    return [
        task_for(c, idempotency_key(c.name, slot), slot, slot + timedelta(seconds=60)) for c in cfgs
    ]


async def sleep_until(epoch: float) -> None:
    await asyncio.sleep(max(0.0, epoch - time.time()))


async def cleanup(prefix: str) -> None:
    client = aioredis.from_url(REDIS)
    keys = [k async for k in client.scan_iter(match=f"*{prefix}*", count=1000)]
    for i in range(0, len(keys), 1000):
        await client.delete(*keys[i : i + 1000])
    await client.aclose()


async def target_run(n: int, mode: str) -> dict[str, Any]:
    """One burst straight into a target; the slot is 1.5 s after the tasks are built."""
    prefix = f"pmbench{uuid.uuid4().hex[:8]}"
    queue = "bench"
    target = make_target(prefix, direct=mode != "kombu")
    # Connections and the script are warm before the slot, as in a running manager.
    await target.enqueue(
        burst(configs(1, "warm"), datetime(2024, 1, 1, tzinfo=UTC)), SystemClock().now()
    )
    slot_epoch = float(int(time.time()) + 2)
    slot = datetime.fromtimestamp(slot_epoch, UTC)
    tasks = burst(configs(n, queue), slot)
    poller = await asyncio.to_thread(Poller, f"{prefix}:{queue}", n, slot_epoch + 120)
    try:
        if mode == "staged":
            batch = target.prepare(tasks)
            prepare_done = time.time()
            await sleep_until(slot_epoch)
            results = await target.send(batch, slot)
        elif mode == "at-slot":
            prepare_done = None
            await sleep_until(slot_epoch)
            results = await target.enqueue(tasks, slot)
        else:
            prepare_done = None
            await sleep_until(slot_epoch)
            size = -(-n // SUB_BATCHES)
            parts = [tasks[i : i + size] for i in range(0, n, size)]
            outcomes = await asyncio.gather(*(target.enqueue(p, slot) for p in parts))
            results = [r for part in outcomes for r in part]
        seen = await poller.result()
    finally:
        await target.close()
        await cleanup(prefix)
    assert [r.status for r in results] == ["enqueued"] * n, "a task was not enqueued"
    return {
        "first": seen["first"] - slot_epoch,
        "last": seen["last"] - slot_epoch,
        "ahead": None if prepare_done is None else slot_epoch - prepare_done,
    }


async def manager_run(n: int, direct: bool) -> dict[str, Any]:
    """N schedules due at one instant in a real manager; the first slot after its start."""
    prefix = f"pmbench{uuid.uuid4().hex[:8]}"
    queue = "bench"
    target = make_target(prefix, direct=direct)
    # The slot: far enough ahead for the manager to register N entries before it.
    slot_epoch = float(int(time.time()) + 8)
    anchor = datetime.fromtimestamp(slot_epoch, UTC)
    manager = PeriodicTaskManager(
        StaticProvider(configs(n, queue, anchor)),
        target,
        clock=SystemClock(),
        timing=Timing(sync_interval=3600, grace=60),
        close_target=True,
    )
    await manager.start()
    try:
        if time.time() > slot_epoch - 1:
            raise RuntimeError("the manager took too long to start for this slot")
        poller = await asyncio.to_thread(Poller, f"{prefix}:{queue}", n, slot_epoch + 120)
        seen = await poller.result()
    finally:
        await manager.stop()
        await cleanup(prefix)
    if seen["last"] is None:
        raise RuntimeError(f"only {seen['size']} of {n} messages arrived")
    return {"first": seen["first"] - slot_epoch, "last": seen["last"] - slot_epoch, "ahead": None}


async def worker_drain(n: int) -> str:
    """A written burst, then a real worker (prefork, 2 processes) runs it: exactly once?"""
    prefix = f"pmbench{uuid.uuid4().hex[:8]}"
    queue = "bench"
    target = make_target(prefix, direct=True)
    slot = SystemClock().now()
    tasks = burst(configs(n, queue), slot)
    try:
        results = await target.enqueue(tasks, slot)
    finally:
        await target.close()
    assert all(r.status == "enqueued" for r in results)
    env = {
        **os.environ,
        "PM_TEST_BROKER": REDIS,
        "PM_TEST_OUT": f"{prefix}:out",
        "PM_TEST_KEYPREFIX": f"{prefix}:",
    }
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tests.support.celery_worker_app",
        "worker",
        "--pool=prefork",
        "--concurrency=2",
        "-Q",
        queue,
        "--hostname",
        f"{prefix}@%h",
        "--without-heartbeat",
        "--without-mingle",
        "--without-gossip",
        "-l",
        "WARNING",
    ]
    client = aioredis.from_url(REDIS)
    started = time.time()
    worker = subprocess.Popen(  # noqa: ASYNC220 - started once, not waited for here
        argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        out = f"{prefix}:out"
        while await client.llen(out) < n and time.time() - started < 600:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        took = time.time() - started
        await asyncio.sleep(1.0)  # anything run twice would show up now
        runs = [json.loads(r) for r in await client.lrange(f"{prefix}:out", 0, -1)]
    finally:
        worker.terminate()
        worker.wait(30)
        await client.aclose()
        await cleanup(prefix)
    ids = [r["id"] for r in runs]
    expected = {t.id for t in tasks}
    verdict = "every task exactly once" if len(ids) == n and set(ids) == expected else "NOT once"
    return (
        f"| {n:,} written tasks, one real worker (prefork, 2 processes) | {len(ids):,} runs, "
        f"{len(set(ids)):,} distinct task ids, {verdict} "
        f"| {took:.1f} s from the worker's start ({n / took:,.0f} tasks/s) |"
    )


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s [{min(values):.3f}-{max(values):.3f}]"


async def row(
    label: str, runs: int, run: Callable[[], Awaitable[dict[str, Any]]]
) -> tuple[str, float]:
    got = []
    for _ in range(runs):
        got.append(await run())
    last = [g["last"] for g in got]
    ahead = [g["ahead"] for g in got if g["ahead"] is not None]
    extra = f" (prepared {statistics.median(ahead):.2f} s ahead)" if ahead else ""
    text = f"| {label}{extra} | {runs} | {fmt([g['first'] for g in got])} | {fmt(last)} |"
    print(text, flush=True)
    return text, statistics.median(last)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-worker", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # a skipped or failed slot would still show
    n, runs = args.n, args.runs
    print(f"# Celery burst: {n:,} tasks due at one instant into one queue\n")
    print(f"{machine()}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
    print("| path | runs | first message after the slot, median [min-max] | last message |")
    print("|---|---|---|---|")
    _, staged = await row("target, written to Redis, staged", runs, lambda: target_run(n, "staged"))
    _, at_slot = await row(
        "target, written to Redis, at the slot", runs, lambda: target_run(n, "at-slot")
    )
    _, kombu = await row(
        f"target, kombu send_task, {SUB_BATCHES} sub-batches in flight",
        max(1, runs // 2),
        lambda: target_run(n, "kombu"),
    )
    _, mgr_direct = await row(
        "manager + target written to Redis", runs, lambda: manager_run(n, True)
    )
    _, mgr_kombu = await row(
        "manager + target through kombu", max(1, runs // 2), lambda: manager_run(n, False)
    )
    print()
    goal = 0.5
    print("| measure | value | goal | verdict |")
    print("|---|---|---|---|")
    for label, value in (
        ("staged target", staged),
        ("target at the slot", at_slot),
        ("manager", mgr_direct),
    ):
        verdict = "PASS" if value <= goal else "MISS"
        print(
            f"| written, {label}: last message after the slot (median) | {value:.3f} s "
            f"| <= {goal} s | {verdict} |"
        )
    print(f"| kombu / written, target at the slot | {kombu / at_slot:.1f}x | | |")
    print(f"| kombu / written, manager | {mgr_kombu / mgr_direct:.1f}x | | |")
    if not args.no_worker:
        print("\n| worker | runs | drained |")
        print("|---|---|---|")
        print(await worker_drain(n), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
