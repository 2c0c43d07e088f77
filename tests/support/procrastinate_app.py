"""A procrastinate app for a real ``procrastinate worker`` in the tests
(``procrastinate --app=tests.support.procrastinate_app.app``).

The database comes from ``PM_TEST_PG`` (a libpq URL). The task ``record`` appends what it
received (its keyword arguments, job id, queue and task name) as a JSON line to the file
``PM_TEST_OUT``; the task ``fail`` raises.
"""

from __future__ import annotations

import json
import os
from typing import Any

import procrastinate

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=os.environ.get("PM_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
)


@app.task(name="record", pass_context=True)
def record(context: procrastinate.JobContext, **kwargs: Any) -> None:
    job = context.job
    entry = {"task": job.task_name, "kwargs": kwargs, "id": job.id, "queue": job.queue}
    with open(os.environ["PM_TEST_OUT"], "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")


@app.task(name="fail")
def fail(**kwargs: Any) -> None:
    """Always fails (options.pause_after_failures)."""
    raise RuntimeError("told to fail")
