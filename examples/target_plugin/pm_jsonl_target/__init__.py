"""The ``jsonl`` target plugin: what periodic-manager reads of it (docs/targets.md).

This module is loaded by every periodic-manager process that reads its settings, so it stays
light: the target itself (:mod:`pm_jsonl_target.target`) is imported when it is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from periodic_manager.targets.plugin import Refusal, TargetPlugin

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from periodic_manager.contracts import Target

# Why it cannot honour options.overlap skip/hold and options.pause_after_failures (a schedule
# asking for them is refused when it is written, naming the reason).
NO_COMPLETION = "a line of a file says nothing of whether its task finished"
NO_FAILURE = "a line of a file says nothing of whether its task failed"


class JsonlSettings(BaseModel):
    """Its settings: each field is a PM_* variable (PM_JSONL_PATH), with its default and
    description; periodic-manager adds them to its own."""

    jsonl_path: str = Field("tasks.jsonl", description="file the jsonl target appends tasks to")


def _build(settings: JsonlSettings, engine: AsyncEngine) -> Target:
    from pm_jsonl_target.target import JsonlTarget

    return JsonlTarget(settings.jsonl_path)


def _refuse(settings: JsonlSettings) -> Refusal | None:
    folder = Path(settings.jsonl_path).parent
    if folder.is_dir():
        return None
    return Refusal(f"the jsonl target's folder {folder} does not exist", "jsonl_path")


PLUGIN: TargetPlugin[JsonlSettings] = TargetPlugin(
    name="jsonl",
    settings=JsonlSettings,
    build=_build,
    where=lambda settings: f"file {settings.jsonl_path}",
    url_setting=lambda settings: "PM_JSONL_PATH",
    completion=lambda settings: NO_COMPLETION,
    failure=lambda settings: NO_FAILURE,
    task_problem="pm_jsonl_target.target:task_problem",
    refuse=_refuse,
)
