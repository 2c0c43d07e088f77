"""The ``http`` target: each slot one signed request to an HTTP receiver, durably delivered
(rows of ``pm_http_deliveries`` in the manager's database, retried, dead letters replayable)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from periodic_manager.plugins.installed import load
from periodic_manager.targets.plugin import Library, OptionalText, TargetPlugin
from periodic_manager.urls import redact_url

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from periodic_manager.contracts import Target

HTTPX = Library("http", "httpx", "pip install 'periodic-manager[http]'")
HTTP_OPTIONS = ("url", "method", "headers", "secret", "retry", "follow_redirects")


class HttpSettings(BaseModel):
    """The settings of the ``http`` target."""

    http_url: OptionalText = Field(
        None, description="the URL a schedule of the http target without options.url posts to"
    )
    http_concurrency_per_host: int = Field(
        16, ge=1, le=1000, description="requests open at once to one receiver (host and port)"
    )
    http_allow_private: bool = Field(
        False,
        description="allow receivers on loopback, link-local and private addresses (off: a "
        "schedule's URL cannot reach the manager's own network, SSRF)",
    )
    http_ca_bundle: OptionalText = Field(
        None, description="a CA bundle (PEM file) to verify receivers' TLS certificates with"
    )
    http_max_response_bytes: int = Field(
        65_536, ge=0, le=16 * 1024 * 1024, description="bytes of an answer read at most"
    )
    http_poll_interval: float = Field(
        1.0, gt=0, le=60, description="seconds between two looks for due deliveries"
    )
    http_lease_margin: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="seconds a claimed delivery stays leased beyond twice its timeout (how "
        "soon another manager takes over the deliveries of one that died)",
    )
    http_done_retention: float = Field(
        86_400.0,
        ge=3600,
        le=366 * 86_400,
        description="seconds a done delivery is kept (its key deduplicates a slot sent again); "
        "dead ones are kept until purged",
    )


def _build(settings: HttpSettings, engine: AsyncEngine) -> Target:
    config = load("periodic_manager.targets.http.config:HttpConfig")(
        url=settings.http_url,
        concurrency_per_host=settings.http_concurrency_per_host,
        allow_private=settings.http_allow_private,
        ca_bundle=settings.http_ca_bundle,
        max_response_bytes=settings.http_max_response_bytes,
        poll_interval=settings.http_poll_interval,
        lease_margin=settings.http_lease_margin,
        done_retention=settings.http_done_retention,
    )
    return load("periodic_manager.targets.http.target:HttpTarget")(engine, config)


def _where(settings: HttpSettings) -> str:
    default = f", default {redact_url(settings.http_url)}" if settings.http_url else ""
    return f"HTTP receivers via table pm_http_deliveries{default}"


PLUGIN: TargetPlugin[HttpSettings] = TargetPlugin(
    name="http",
    settings=HttpSettings,
    build=_build,
    where=_where,
    url_setting=lambda settings: "PM_HTTP_URL",
    task_problem="periodic_manager.targets.http.options:task_problem",
    options=HTTP_OPTIONS,
    library=HTTPX,
)
