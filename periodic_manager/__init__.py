"""periodic_manager: a dynamic periodic-task manager backed by a relational database.

Schedules live as rows in ``periodic_jobs``; a :class:`PeriodicTaskManager` reads them through a
:class:`ConfigProvider`, keeps one scheduler entry per schedule and enqueues a task to a
:class:`Target` on every due slot, exactly once per ``<name>:<slot>`` idempotency key.
"""

__version__ = "0.1.0"

from periodic_manager.clock import SystemClock, VirtualClock
from periodic_manager.contracts import Clock, ConfigProvider, EnqueueResult, Target, Task
from periodic_manager.errors import (  # noqa: E402
    ConfigError,
    NotFoundError,
    PeriodicManagerError,
    ProviderError,
    TargetError,
)
from periodic_manager.providers import StaticProvider
from periodic_manager.runtime.manager import PeriodicTaskManager, SyncReport  # noqa: E402
from periodic_manager.schedules.definition import PeriodicTaskConfig  # noqa: E402

__all__ = [
    "Clock",
    "ConfigError",
    "ConfigProvider",
    "EnqueueResult",
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
    "VirtualClock",
    "__version__",
]
