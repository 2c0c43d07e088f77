"""The ``arq`` target: arq jobs, written the way ``enqueue_job`` writes them."""

from __future__ import annotations

from pydantic import Field

from periodic_manager.targets.builtin.redis import RedisConnection, own_url_plugin
from periodic_manager.targets.plugin import Library

ARQ = Library("arq", "arq", "pip install 'periodic-manager[arq]'")


class ArqSettings(RedisConnection):
    """The settings of the ``arq`` target."""

    arq_redis_url: str | None = Field(
        None, description="Redis URL of the arq queues (default: redis_url)"
    )


PLUGIN = own_url_plugin(
    "arq",
    ArqSettings,
    "arq_redis_url",
    "periodic_manager.targets.arq:ArqTarget",
    library=ARQ,
    task_problem="periodic_manager.targets.arq:task_problem",
)
