"""The ``dramatiq`` target: Dramatiq messages, on its RedisBroker or RabbitMQ."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, field_validator

from periodic_manager.plugins.installed import load
from periodic_manager.targets.builtin.redis import RedisConnection, single_redis
from periodic_manager.targets.plugin import Library, TargetPlugin
from periodic_manager.urls import redact_url

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from periodic_manager.contracts import Target

DRAMATIQ = Library("dramatiq", "dramatiq", "pip install 'periodic-manager[dramatiq]'")
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
AMQP_SCHEMES = ("amqp://", "amqps://")
# Why it cannot tell that a task finished, nor that it failed.
DRAMATIQ_NO_RESULTS = (
    "Dramatiq deletes a message once a worker acknowledges it and records no outcome without its "
    "Results middleware, whose backend the dramatiq target does not read"
)


def check_url(url: str) -> str:
    """``url`` if Dramatiq's broker can be reached with it (ValueError naming the schemes)."""
    if not url.startswith(REDIS_SCHEMES + AMQP_SCHEMES) or url.endswith("://"):
        raise ValueError(
            "must be a redis:// (rediss://, unix://) or amqp:// (amqps://) URL of Dramatiq's broker"
        )
    return url


class DramatiqSettings(RedisConnection):
    """The settings of the ``dramatiq`` target."""

    dramatiq_url: str | None = Field(
        None,
        description="Dramatiq's broker, redis:// or amqp:// (default: redis_url); on RabbitMQ the "
        "claims live in redis_url",
    )
    dramatiq_namespace: str = Field(
        "dramatiq", min_length=1, description="the namespace (key prefix) of Dramatiq's RedisBroker"
    )

    @field_validator("dramatiq_url")
    @classmethod
    def _dramatiq_url(cls, v: str | None) -> str | None:
        return None if v is None else check_url(v)


def broker(settings: DramatiqSettings) -> str:
    """The broker the dramatiq target sends to: ``dramatiq_url``, else ``redis_url``."""
    return settings.dramatiq_url or settings.redis_url


def _build(settings: DramatiqSettings, engine: AsyncEngine) -> Target:
    url = broker(settings)
    return load("periodic_manager.targets.dramatiq:DramatiqTarget").from_url(
        url,
        claims_url=settings.redis_url if url.startswith(AMQP_SCHEMES) else None,
        prefix=settings.stream_prefix,
        namespace=settings.dramatiq_namespace,
    )


def _where(settings: DramatiqSettings) -> str:
    # The broker, and where the claims live when that broker is RabbitMQ.
    url = broker(settings)
    if url.startswith(AMQP_SCHEMES):
        return f"{redact_url(url)}, claims {redact_url(settings.redis_url)}"
    return f"{redact_url(url)}, namespace {settings.dramatiq_namespace}"


PLUGIN: TargetPlugin[DramatiqSettings] = TargetPlugin(
    name="dramatiq",
    settings=DramatiqSettings,
    build=_build,
    where=_where,
    url_setting=lambda s: "PM_DRAMATIQ_URL" if s.dramatiq_url is not None else "PM_REDIS_URL",
    completion=lambda settings: DRAMATIQ_NO_RESULTS,
    failure=lambda settings: DRAMATIQ_NO_RESULTS,
    task_problem="periodic_manager.targets.dramatiq:task_problem",
    library=DRAMATIQ,
    refuse=single_redis("dramatiq"),
)
