"""The ``asynq`` target: tasks written as asynq's client writes them, for Go workers running an
unmodified ``asynq.Server`` (periodic_manager/targets/asynq/), on its own Redis URL setting;
``PM_REDIS_CLUSTER`` makes that Redis a Redis Cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from periodic_manager.plugins.installed import load
from periodic_manager.targets.builtin.redis import RedisConnection
from periodic_manager.targets.plugin import Library, OptionalText, TargetPlugin
from periodic_manager.urls import redact_url

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from periodic_manager.contracts import Target

NO_CLUSTER_OVERLAP = (
    "on a Redis Cluster the asynq target keeps no previous task per schedule (its key would sit "
    "in another slot than the queue's)"
)
PROTOBUF = Library("asynq", "google.protobuf", "pip install 'periodic-manager[asynq]'")


class AsynqSettings(RedisConnection):
    """The settings of the ``asynq`` target."""

    asynq_redis_url: OptionalText = Field(
        None, description="Redis URL of the asynq queues (default: redis_url)"
    )


def _url(settings: AsynqSettings) -> str:
    return settings.asynq_redis_url or settings.redis_url


def _build(settings: AsynqSettings, engine: AsyncEngine) -> Target:
    target_class = load("periodic_manager.targets.asynq.target:AsynqTarget")
    made: Target = target_class.from_url(
        _url(settings), prefix=settings.stream_prefix, cluster=settings.redis_cluster
    )
    return made


PLUGIN: TargetPlugin[AsynqSettings] = TargetPlugin(
    name="asynq",
    settings=AsynqSettings,
    build=_build,
    where=lambda settings: redact_url(_url(settings)),
    url_setting=lambda settings: (
        "PM_ASYNQ_REDIS_URL" if settings.asynq_redis_url else "PM_REDIS_URL"
    ),
    completion=lambda settings: NO_CLUSTER_OVERLAP if settings.redis_cluster else None,
    task_problem="periodic_manager.targets.asynq:task_problem",
    library=PROTOBUF,
)
