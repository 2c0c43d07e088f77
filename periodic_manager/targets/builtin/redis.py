"""The ``redis`` target (Redis Streams), and the Redis connection every Redis target shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from periodic_manager.plugins.installed import load
from periodic_manager.targets.plugin import OptionalText, Refusal, TargetPlugin
from periodic_manager.urls import redact_url

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from periodic_manager.contracts import Target

REDIS_NO_GROUP = (
    "no consumer group: set PM_REDIS_GROUP to the group your workers read with "
    "(examples/consume_redis.py --group)"
)
REDIS_NO_FAILURE = "a consumer group acknowledges a message whether its task succeeded or failed"


class RedisConnection(BaseModel):
    """The Redis of the Redis targets (and of the claims of targets whose broker is not Redis)."""

    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL for the redis target")
    redis_cluster: bool = Field(
        False,
        description="redis_url names a node of a Redis Cluster: the redis target uses a cluster "
        "client (a target that needs a single Redis refuses it)",
    )
    stream_prefix: str = Field("pm", description="prefix of Redis keys")


def single_redis(name: str) -> Callable[[RedisConnection], Refusal | None]:
    """The refusal of a target that cannot run on a Redis Cluster."""

    def refuse(settings: RedisConnection) -> Refusal | None:
        if not settings.redis_cluster:
            return None
        return Refusal(
            f"the {name} target cannot run on a Redis Cluster (it needs a single Redis): unset "
            "PM_REDIS_CLUSTER or use a single Redis",
            "redis_cluster",
        )

    return refuse


class RedisStreamsSettings(RedisConnection):
    """The settings of the ``redis`` target."""

    redis_maxlen: int | None = Field(None, gt=0, description="approximate MAXLEN per stream")
    redis_group: OptionalText = Field(
        None,
        description="consumer group your Redis Streams workers read with (consume_redis.py --group): "
        "how the redis target tells that a task finished (options.overlap skip/hold)",
    )


def no_completion(group: str | None) -> str | None:
    """Redis Streams: the consumer group's acknowledgements (None: it can tell)."""
    return None if group is not None else REDIS_NO_GROUP


def _build(settings: RedisStreamsSettings, engine: AsyncEngine) -> Target:
    return load("periodic_manager.targets.redis.streams:RedisStreamsTarget").from_url(
        settings.redis_url,
        prefix=settings.stream_prefix,
        maxlen=settings.redis_maxlen,
        group=settings.redis_group,
        cluster=settings.redis_cluster,
    )


def _where(settings: RedisStreamsSettings) -> str:
    # Whether overlap skip/hold can work depends on the workers' consumer group.
    group = settings.redis_group
    return redact_url(settings.redis_url) + (
        f", consumer group {group}" if group else ", no consumer group"
    )


PLUGIN: TargetPlugin[RedisStreamsSettings] = TargetPlugin(
    name="redis",
    settings=RedisStreamsSettings,
    build=_build,
    where=_where,
    url_setting=lambda settings: "PM_REDIS_URL",
    completion=lambda settings: no_completion(settings.redis_group),
    failure=lambda settings: REDIS_NO_FAILURE,
)
