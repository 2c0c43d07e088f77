"""arq worker settings for the tests, run as a real worker: ``arq tests.arq_worker_app.WorkerSettings``.

Its functions record what they received (arguments, job id, try) as JSON lines in the Redis list
``PM_TEST_OUT``; the worker reads the queue ``PM_TEST_QUEUE`` on ``PM_TEST_REDIS``. Results are
not kept (``keep_result = 0``): arq then forgets a job id as soon as the job is done, which is the
case the manager's own claim exists for.
"""

from __future__ import annotations

import json
import os
from typing import Any

from arq.connections import RedisSettings

REDIS = os.environ.get("PM_TEST_REDIS", "redis://127.0.0.1:6379/0")
OUT = os.environ.get("PM_TEST_OUT", "pmtest:arq:out")
QUEUE = os.environ.get("PM_TEST_QUEUE", "arq:queue")


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


class WorkerSettings:
    functions = [record, other]
    redis_settings = RedisSettings.from_dsn(REDIS)
    queue_name = QUEUE
    keep_result = 0
    poll_delay = 0.05
    health_check_interval = 3600
    max_jobs = 4
