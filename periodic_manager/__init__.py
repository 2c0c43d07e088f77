"""periodic_manager: a dynamic periodic-task manager backed by a relational database.

Schedules live as rows in ``periodic_jobs``; a :class:`PeriodicTaskManager` reads them through a
:class:`ConfigProvider`, keeps one scheduler entry per schedule and enqueues a task to a
:class:`Target` on every due slot, exactly once per ``<name>:<slot>`` idempotency key.

Importing the package loads nothing but this module and ``version``: each public name is
imported when first used (``import periodic_manager.cron`` loads only the cron engine).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from periodic_manager.version import __version__

# Public name -> the module that defines it.
_HOMES = {
    "Clock": "periodic_manager.contracts",
    "ConfigProvider": "periodic_manager.contracts",
    "EnqueueResult": "periodic_manager.contracts",
    "Target": "periodic_manager.contracts",
    "Task": "periodic_manager.contracts",
    "SystemClock": "periodic_manager.clock",
    "VirtualClock": "periodic_manager.clock",
    "ConfigError": "periodic_manager.errors",
    "NotFoundError": "periodic_manager.errors",
    "PeriodicManagerError": "periodic_manager.errors",
    "ProviderError": "periodic_manager.errors",
    "TargetError": "periodic_manager.errors",
    "PeriodicTaskConfig": "periodic_manager.schedules.definition",
    "StaticProvider": "periodic_manager.providers",
    "Hooks": "periodic_manager.engine.dispatch",
    "PeriodicTaskManager": "periodic_manager.runtime.manager",
    "SyncReport": "periodic_manager.runtime.reconcile",
    "Timing": "periodic_manager.runtime.timing",
}

__all__ = [
    "Clock",
    "ConfigError",
    "ConfigProvider",
    "EnqueueResult",
    "Hooks",
    "NotFoundError",
    "PeriodicManagerError",
    "PeriodicTaskConfig",
    "PeriodicTaskManager",
    "ProviderError",
    "StaticProvider",
    "SyncReport",
    "SystemClock",
    "Target",
    "TargetError",
    "Task",
    "Timing",
    "VirtualClock",
    "__version__",
]

if TYPE_CHECKING:
    from periodic_manager.clock import SystemClock, VirtualClock
    from periodic_manager.contracts import Clock, ConfigProvider, EnqueueResult, Target, Task
    from periodic_manager.engine.dispatch import Hooks
    from periodic_manager.errors import (
        ConfigError,
        NotFoundError,
        PeriodicManagerError,
        ProviderError,
        TargetError,
    )
    from periodic_manager.providers import StaticProvider
    from periodic_manager.runtime.manager import PeriodicTaskManager
    from periodic_manager.runtime.reconcile import SyncReport
    from periodic_manager.runtime.timing import Timing
    from periodic_manager.schedules.definition import PeriodicTaskConfig


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'periodic_manager' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
