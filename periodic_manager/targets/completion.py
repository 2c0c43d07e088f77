"""Whether a schedule's options need a completion signal (``options.overlap`` skip and hold) or a
failure signal (``options.pause_after_failures``). Why a target cannot give one is its plugin's
answer (``completion`` and ``failure`` of :class:`~periodic_manager.targets.plugin.TargetPlugin`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def asks(options: Mapping[str, Any]) -> bool:
    """Whether a schedule with these options needs a completion signal (overlap skip or hold)."""
    return options.get("overlap", "allow") != "allow"


def fails(options: Mapping[str, Any]) -> bool:
    """Whether a schedule with these options needs a failure signal (pause_after_failures)."""
    return "pause_after_failures" in options
