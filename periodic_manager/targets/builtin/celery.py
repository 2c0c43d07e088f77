"""The ``celery`` target: Celery messages, on a Redis broker written directly (or via kombu)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from periodic_manager.plugins.installed import load
from periodic_manager.targets.builtin.redis import RedisConnection, single_redis
from periodic_manager.targets.plugin import Library, OptionalText, TargetPlugin, none_if_blank
from periodic_manager.urls import redact_url

CELERY = Library("celery", "celery", "pip install 'periodic-manager[celery]'")
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from periodic_manager.contracts import Target

CELERY_NO_BACKEND = (
    "no result backend: set PM_CELERY_RESULT_BACKEND (or result_backend in your Celery app) to "
    "the one your workers write to"
)


def load_app(path: str) -> Any:
    """The Celery app ``path`` names (:func:`periodic_manager.targets.celery.app.load_app`),
    that module imported only when a Celery app is named."""
    return load("periodic_manager.targets.celery.app:load_app")(path)


class CelerySettings(RedisConnection):
    """The settings of the ``celery`` target."""

    celery_app: str | None = Field(
        None,
        description="your Celery app, 'package.module:app': its broker, queues and routes are honoured",
    )
    celery_broker_url: str | None = Field(
        None, description="Celery broker URL (default: the app's broker_url, else redis_url)"
    )
    celery_fast_path: bool = Field(
        True, description="write Celery messages to a Redis broker directly (false: always kombu)"
    )
    celery_result_backend: OptionalText = Field(
        None,
        description="result backend the celery target reads to tell that a task finished "
        "(options.overlap skip/hold); default: your app's result_backend",
    )
    celery_publish_timeout: float = Field(
        5.0, gt=0, description="seconds one publish to the Celery broker may take"
    )

    @field_validator("celery_app", mode="before")
    @classmethod
    def _celery_app(cls, v: object) -> object:
        v = none_if_blank(v)
        if isinstance(v, str):
            load_app(v.strip())  # fail at start, naming the setting, not at the first slot
            return v.strip()
        return v


def broker(settings: CelerySettings) -> str:
    """The broker the celery target publishes to: ``celery_broker_url``, else the ``broker_url``
    of ``celery_app``, else ``redis_url``."""
    if settings.celery_broker_url is not None:
        return settings.celery_broker_url
    if settings.celery_app is not None:
        found = load_app(settings.celery_app).conf.broker_url
        if isinstance(found, str) and found:
            return found
    return settings.redis_url


def backend(settings: CelerySettings) -> str | None:
    """The result backend of the celery target: ``celery_result_backend``, else the
    ``result_backend`` of ``celery_app``; None without one."""
    if settings.celery_result_backend is not None:
        return settings.celery_result_backend
    if settings.celery_app is None:
        return None
    found = load_app(settings.celery_app).conf.result_backend
    if not isinstance(found, str) or found in ("", "disabled"):
        return None
    return found


def no_signal(has_result_backend: bool) -> str | None:
    """Celery: the result backend's ready and FAILURE states (None: it can tell)."""
    return None if has_result_backend else CELERY_NO_BACKEND


def _build(settings: CelerySettings, engine: AsyncEngine) -> Target:
    """The app of ``celery_app`` (its settings honoured) or a bare app on ``celery_broker_url`` /
    ``redis_url``; claims beside the messages on a Redis broker, otherwise in ``redis_url``."""
    target = load("periodic_manager.targets.celery.target:CeleryTarget")
    url = broker(settings)
    make = (
        partial(
            target.from_app,
            load_app(settings.celery_app),
            broker_url=settings.celery_broker_url,
        )
        if settings.celery_app
        else partial(target.from_url, url)
    )
    return make(
        claims_url=None if url.startswith(REDIS_SCHEMES) else settings.redis_url,
        prefix=settings.stream_prefix,
        timeout=settings.celery_publish_timeout,
        fast_path=settings.celery_fast_path,
        result_backend=backend(settings),
    )


def _where(settings: CelerySettings) -> str:
    # The broker it publishes to (PM_CELERY_APP's own when that sets one), where the claims live
    # when that broker is not Redis, and the result backend.
    url = broker(settings)
    where = redact_url(url)
    if not url.startswith(REDIS_SCHEMES):
        where += f", claims {redact_url(settings.redis_url)}"
    results = backend(settings)
    return where + (f", results {redact_url(results)}" if results else "")


def _url_setting(settings: CelerySettings) -> str:
    if settings.celery_broker_url is not None:
        return "PM_CELERY_BROKER_URL"
    return "PM_CELERY_APP" if settings.celery_app is not None else "PM_REDIS_URL"


PLUGIN: TargetPlugin[CelerySettings] = TargetPlugin(
    name="celery",
    settings=CelerySettings,
    build=_build,
    where=_where,
    url_setting=_url_setting,
    completion=lambda settings: no_signal(backend(settings) is not None),
    failure=lambda settings: no_signal(backend(settings) is not None),
    library=CELERY,
    refuse=single_redis("celery"),
)
