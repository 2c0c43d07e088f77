"""The ConfigProvider protocol and the static provider."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from periodic_manager.schedules.definition import PeriodicTaskConfig


@dataclass(frozen=True, slots=True)
class RowError:
    """A row the provider could not turn into a config (bad spec, zone, payload, options...)."""

    schedule_id: int | str
    name: str | None
    content_hash: str  # hash of the raw row content, so an error is logged once per (row, content)
    field: str
    reason: str
    code: str = "value_error"  # ConfigError.code: "too-large", "out-of-range", "never-fires", ...
    revision: int | None = None  # the row's revision when judged (a database row's), if known

    @property
    def message(self) -> str:
        return f"{self.field}: {self.reason}"


@dataclass(frozen=True, slots=True)
class ProviderSnapshot:
    """Everything a sync needs: the usable enabled configs and the rows that were rejected."""

    configs: Sequence[PeriodicTaskConfig]
    errors: Sequence[RowError] = ()
    revision: int | None = None  # the source's change counter when read (incremental providers)


@dataclass(frozen=True, slots=True)
class ChangeSet:
    """What changed since a revision: rows written (enabled and valid, or rejected) and the keys of
    rows deleted or disabled. ``full`` asks for a full read instead (e.g. after a TRUNCATE)."""

    revision: int
    configs: Sequence[PeriodicTaskConfig] = ()
    errors: Sequence[RowError] = ()
    removed: Sequence[str] = ()
    full: bool = False


class ConfigProvider(Protocol):
    """Source of schedules. One method: return every enabled, valid schedule right now.

    Raises ProviderError when the source cannot be read (the manager then keeps its entries).
    """

    async def get_configs(self) -> ProviderSnapshot: ...


class IncrementalProvider(ConfigProvider, Protocol):
    """A provider that can also say what changed since the revision of an earlier read."""

    async def get_changes(self, since: int) -> ChangeSet | None:
        """None when nothing changed since ``since`` (one cheap query); else the changes."""
        ...


class StaticProvider:
    """A fixed (but replaceable) list of configs, for code and tests."""

    def __init__(self, configs: Iterable[PeriodicTaskConfig] = ()) -> None:
        self.configs: list[PeriodicTaskConfig] = list(configs)
        self.errors: list[RowError] = []

    async def get_configs(self) -> ProviderSnapshot:
        return ProviderSnapshot(configs=list(self.configs), errors=list(self.errors))
