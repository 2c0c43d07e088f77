"""The ``procrastinate`` target: rows of ``procrastinate_jobs`` in the manager's PostgreSQL."""

from __future__ import annotations

from typing import TYPE_CHECKING

from periodic_manager.plugins.installed import load
from periodic_manager.targets.plugin import Library, ManagerSettings, Refusal, TargetPlugin
from periodic_manager.urls import redact_url

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from periodic_manager.contracts import Target

PROCRASTINATE = Library(
    "procrastinate", "procrastinate", "pip install 'periodic-manager[procrastinate]'"
)
POSTGRESQL_ONLY = "the procrastinate target needs PostgreSQL (procrastinate is PostgreSQL only)"


def _build(settings: ManagerSettings, engine: AsyncEngine) -> Target:
    return load("periodic_manager.targets.procrastinate:ProcrastinateTarget")(engine)


def _refuse(settings: ManagerSettings) -> Refusal | None:
    if settings.database_url.startswith("postgres"):
        return None
    return Refusal(f"{POSTGRESQL_ONLY}: set PM_DATABASE_URL to a postgresql:// database")


PLUGIN: TargetPlugin[ManagerSettings] = TargetPlugin(
    name="procrastinate",
    build=_build,
    where=lambda settings: f"procrastinate_jobs in {redact_url(settings.database_url)}",
    url_setting=lambda settings: "PM_DATABASE_URL",
    task_problem="periodic_manager.targets.procrastinate:task_problem",
    library=PROCRASTINATE,
    refuse=_refuse,
)
