"""Functions for a real RQ worker in the tests: ``rq worker`` imports them by their dotted path
(``tests.support.rq_worker_app.record``).

Each records what it received (arguments, job id, queue, meta) as a JSON line in the Redis list
``PM_TEST_OUT`` on ``PM_TEST_REDIS``; :func:`flaky` raises instead while the key
``<PM_TEST_OUT>:fail`` exists.
"""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from rq import get_current_job

REDIS = os.environ.get("PM_TEST_REDIS", "redis://127.0.0.1:6379/0")
OUT = os.environ.get("PM_TEST_OUT", "pmtest:rq:out")


def _record(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    job = get_current_job()
    assert job is not None
    entry = {
        "task": name,
        "args": list(args),
        "kwargs": kwargs,
        "id": job.id,
        "queue": job.origin,
        "meta": job.meta,
    }
    client = redis.Redis.from_url(REDIS)
    try:
        client.rpush(OUT, json.dumps(entry))
    finally:
        client.close()


def record(*args: Any, **kwargs: Any) -> None:
    _record("record", args, kwargs)


def other(*args: Any, **kwargs: Any) -> None:
    _record("other", args, kwargs)


def flaky(*args: Any, **kwargs: Any) -> None:
    """Fails (raises) while ``<PM_TEST_OUT>:fail`` exists, records otherwise."""
    client = redis.Redis.from_url(REDIS)
    try:
        failing = client.exists(f"{OUT}:fail")
    finally:
        client.close()
    if failing:
        raise RuntimeError("told to fail")
    _record("flaky", args, kwargs)
