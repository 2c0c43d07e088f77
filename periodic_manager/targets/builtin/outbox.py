"""The ``outbox`` target: rows of ``pm_outbox`` in the manager's own database."""

from __future__ import annotations

from typing import TYPE_CHECKING

from periodic_manager.plugins.installed import load
from periodic_manager.targets.plugin import ManagerSettings, TargetPlugin

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from periodic_manager.contracts import Target

OUTBOX_NO_FAILURE = (
    "an outbox row records when it was processed (processed_at), not whether its task failed"
)


def _build(settings: ManagerSettings, engine: AsyncEngine) -> Target:
    return load("periodic_manager.targets.outbox:OutboxTarget")(engine)


PLUGIN: TargetPlugin[ManagerSettings] = TargetPlugin(
    name="outbox",
    build=_build,
    where=lambda settings: "table pm_outbox",
    url_setting=lambda settings: "PM_DATABASE_URL",
    failure=lambda settings: OUTBOX_NO_FAILURE,
)
