"""Exceptions raised by periodic_manager.

Tree::

    PeriodicManagerError
    ├── ConfigError (also ValueError)      a schedule or setting is invalid: .field, .reason
    │   └── CronError                      (periodic_manager.cron) a cron expression/zone is invalid
    ├── ProviderError                      the config provider could not read the schedules
    ├── TargetError                        a target could not enqueue a batch
    │   └── TaskRefused                    ... and never will: the tasks are invalid for it
    ├── NotFoundError (also LookupError)   a schedule or entry does not exist: .key
    └── NameConflict                       another schedule already has this name: .name

Adapters translate driver errors at their edge (``raise TargetError(...) from exc``); the core
never raises HTTP errors; the API maps these classes to status codes in one place.
"""

from __future__ import annotations


def cause(exc: BaseException) -> str:
    """``exc`` for a log line or an error field: its type and its message, or its type alone
    when it has none (``str()`` of a ``TimeoutError()`` is empty: a line would end in nothing)."""
    text = str(exc)
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


class PeriodicManagerError(Exception):
    """Root of every error this package raises on purpose."""


class ConfigError(PeriodicManagerError, ValueError):
    """Invalid input. ``field`` names what is wrong (``spec``, ``options.queue``), ``reason`` why,
    and ``code`` is a machine-readable kind (``never-fires``, ``unknown-zone``, ``value_error``)."""

    def __init__(self, field: str, reason: str, *, code: str = "value_error") -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
        self.code = code


class ProviderError(PeriodicManagerError):
    """The provider could not return the schedules (database down, timeout, ...)."""


class TargetError(PeriodicManagerError):
    """A target failed to enqueue a batch; nothing of that batch may be assumed enqueued."""


class TaskRefused(TargetError):
    """A target refused a whole call for good: its tasks are invalid for it (a validation error,
    not an outage), so no retry can succeed. Most refusals are per task
    (:func:`periodic_manager.contracts.refused`); this is for a call that cannot be cut up."""


class NotFoundError(PeriodicManagerError, LookupError):
    """A schedule or entry that does not exist."""

    def __init__(self, key: object) -> None:
        super().__init__(f"not found: {key!r}")
        self.key = key


class NameConflict(PeriodicManagerError):
    """Another schedule already has this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"a schedule named {name!r} already exists")
        self.name = name
