"""arq worker settings for the tests, run as a real worker: ``arq tests.support.arq_worker_app.WorkerSettings``.

Its functions record what they received (arguments, job id, try) as JSON lines in the Redis list
``PM_TEST_OUT``; the worker reads the queue ``PM_TEST_QUEUE`` on ``PM_TEST_REDIS``. Results are
not kept (``keep_result = 0``): arq then forgets a job id as soon as the job is done, which is the
case the manager's own claim exists for.

``slow`` works ``PM_TEST_WORK_S`` seconds and records when it started and finished (the overlap
tests); ``PM_TEST_MAX_JOBS`` jobs run at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from arq.connections import RedisSettings

REDIS = os.environ.get("PM_TEST_REDIS", "redis://127.0.0.1:6379/0")
OUT = os.environ.get("PM_TEST_OUT", "pmtest:arq:out")
QUEUE = os.environ.get("PM_TEST_QUEUE", "arq:queue")
WORK_S = float(os.environ.get("PM_TEST_WORK_S", "0"))
MAX_JOBS = int(os.environ.get("PM_TEST_MAX_JOBS", "4"))


async def _record(
    name: str, ctx: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    entry = {
        "task": name,
        "args": list(args),
        "kwargs": kwargs,
        "id": ctx["job_id"],
        "try": ctx["job_try"],
    }
    await ctx["redis"].rpush(OUT, json.dumps(entry))


async def record(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> None:
    await _record("record", ctx, args, kwargs)


async def other(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> None:
    await _record("other", ctx, args, kwargs)


async def slow(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> None:
    started = time.time()
    await asyncio.sleep(WORK_S)
    entry = {"id": ctx["job_id"], "started": started, "finished": time.time(), "kwargs": kwargs}
    await ctx["redis"].rpush(OUT, json.dumps(entry))


class WorkerSettings:
    functions = [record, other, slow]
    redis_settings = RedisSettings.from_dsn(REDIS)
    queue_name = QUEUE
    keep_result = 0
    poll_delay = 0.05
    health_check_interval = 3600
    max_jobs = MAX_JOBS
