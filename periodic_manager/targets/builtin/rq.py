"""The ``rq`` target: RQ jobs, written the way ``Queue.enqueue`` writes them."""

from __future__ import annotations

from pydantic import Field

from periodic_manager.targets.builtin.redis import RedisConnection, own_url_plugin
from periodic_manager.targets.plugin import Library

RQ = Library("rq", "rq", "pip install 'periodic-manager[rq]'")


class RqSettings(RedisConnection):
    """The settings of the ``rq`` target."""

    rq_redis_url: str | None = Field(
        None, description="Redis URL of the RQ queues (default: redis_url)"
    )


PLUGIN = own_url_plugin(
    "rq",
    RqSettings,
    "rq_redis_url",
    "periodic_manager.targets.rq:RqTarget",
    library=RQ,
    task_problem="periodic_manager.targets.rq:task_problem",
)
