"""The ``arq`` and ``rq`` targets: the jobs of two Redis queue libraries, written the way
``enqueue_job`` (arq) and ``Queue.enqueue`` (RQ) write them, each on its own Redis URL setting."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, create_model

from periodic_manager.plugins.installed import load
from periodic_manager.targets.builtin.redis import RedisConnection, single_redis
from periodic_manager.targets.plugin import Library, TargetPlugin
from periodic_manager.urls import redact_url

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from periodic_manager.contracts import Target

ARQ = Library("arq", "arq", "pip install 'periodic-manager[arq]'")
RQ = Library("rq", "rq", "pip install 'periodic-manager[rq]'")


def own_url_plugin(library: Library, url_field: str, queues: str) -> TargetPlugin[RedisConnection]:
    """The plugin of the target named after ``library``, whose class is ``<Name>Target`` of
    ``periodic_manager.targets.<name>`` (its ``from_url(url, prefix=...)`` builds it) and its
    write-time rule that module's ``task_problem``; its Redis is ``url_field``, else
    ``redis_url``."""
    name = library.target
    module = f"periodic_manager.targets.{name}"
    description = f"Redis URL of the {queues} queues (default: redis_url)"
    model: type[RedisConnection] = create_model(
        f"{name.capitalize()}Settings",
        __base__=RedisConnection,
        **{url_field: (str | None, Field(None, description=description))},  # type: ignore[call-overload]
    )

    def url(settings: RedisConnection) -> str:
        own: str | None = getattr(settings, url_field)
        return own or settings.redis_url

    def build(settings: RedisConnection, engine: AsyncEngine) -> Target:
        target_class = load(f"{module}:{name.capitalize()}Target")
        made: Target = target_class.from_url(url(settings), prefix=settings.stream_prefix)
        return made

    def url_setting(settings: RedisConnection) -> str:
        own = getattr(settings, url_field) is not None
        return f"PM_{url_field.upper()}" if own else "PM_REDIS_URL"

    return TargetPlugin(
        name=name,
        settings=model,
        build=build,
        where=lambda settings: redact_url(url(settings)),
        url_setting=url_setting,
        task_problem=f"{module}:task_problem",
        library=library,
        refuse=single_redis(name),
    )


ARQ_PLUGIN = own_url_plugin(ARQ, "arq_redis_url", "arq")
RQ_PLUGIN = own_url_plugin(RQ, "rq_redis_url", "RQ")
