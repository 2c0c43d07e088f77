"""A Celery app for the tests, run as a real worker: ``celery -A tests.support.celery_worker_app worker``.

Its tasks record what they received (arguments, task id, the manager's headers, delivery info) as
JSON lines in the Redis list ``PM_TEST_OUT``. ``PM_TEST_BROKER`` is the broker and
``PM_TEST_KEYPREFIX`` kombu's ``global_keyprefix``, so every key of a test run carries its prefix.
With ``PM_TEST_BACKEND`` results are stored there (``task_track_started`` on): the overlap tests'
``pmtest.slow`` works ``PM_TEST_WORK_S`` seconds and records when it started and finished.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery, Task

BROKER = os.environ.get("PM_TEST_BROKER", "redis://127.0.0.1:6379/0")
OUT = os.environ.get("PM_TEST_OUT", "pmtest:celery:out")
KEYPREFIX = os.environ.get("PM_TEST_KEYPREFIX", "")
BACKEND = os.environ.get("PM_TEST_BACKEND") or None
WORK_S = float(os.environ.get("PM_TEST_WORK_S", "0"))

app = Celery("pm_test_worker", broker=BROKER, set_as_current=True)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    broker_transport_options={"global_keyprefix": KEYPREFIX} if KEYPREFIX else {},
    broker_connection_retry_on_startup=True,
    worker_enable_remote_control=False,  # no pidbox keys shared between test runs
    worker_hijack_root_logger=False,
    result_backend=BACKEND,
    task_track_started=BACKEND is not None,
    result_expires=600,
)
_out = redis.Redis.from_url(BROKER)


def _record(task: Task, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    req = task.request
    _out.rpush(
        OUT,
        json.dumps(
            {
                "task": task.name,
                "args": list(args),
                "kwargs": kwargs,
                "id": req.id,
                "idempotency_key": getattr(req, "idempotency_key", None),
                "scheduled_at": getattr(req, "scheduled_at", None),
                "periodic_name": getattr(req, "periodic_name", None),
                "routing_key": (req.delivery_info or {}).get("routing_key"),
                "priority": (req.delivery_info or {}).get("priority"),
                "timelimit": list(req.timelimit or ()),
                "expires": req.expires,
            }
        ),
    )


@app.task(name="pmtest.record", bind=True)
def record(self: Task, *args: Any, **kwargs: Any) -> None:
    _record(self, args, kwargs)


@app.task(name="pmtest.slow", bind=True)
def slow(self: Task, *args: Any, **kwargs: Any) -> None:
    started = time.time()
    time.sleep(WORK_S)
    entry = {"id": self.request.id, "started": started, "finished": time.time(), "kwargs": kwargs}
    _out.rpush(OUT, json.dumps(entry))


@app.task(name="pmtest.other", bind=True)
def other(self: Task, *args: Any, **kwargs: Any) -> None:
    _record(self, args, kwargs)
