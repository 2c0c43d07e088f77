"""Schedules in: a :class:`ConfigProvider` hands the manager every enabled, valid schedule (and the
rows it rejected); capabilities beyond that are Protocols of their own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.partition import every_partition

__all__ = [
    "RowError",
    "ProviderSnapshot",
    "ChangeSet",
    "ConfigProvider",
    "Known",
    "IncrementalProvider",
    "DigestingProvider",
    "PartitionsHeld",
    "HeldPartitions",
    "PartitionedProvider",
]


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


# The config a manager holds for a row id (None: none), as a provider may reuse it.
Known = Callable[[int], "PeriodicTaskConfig | None"]


@runtime_checkable
class IncrementalProvider(ConfigProvider, Protocol):
    """A provider whose cost follows change: it says what changed since an earlier read, and
    reuses what the manager already holds instead of building it again."""

    async def get_changes(self, since: int) -> ChangeSet | None:
        """None when nothing changed since ``since`` (one cheap query); else the changes."""
        ...

    async def prune_tombstones(self, older_than: datetime) -> int:
        """Forget deletions older than ``older_than`` (a full read makes up for any pruned)."""
        ...

    def adopt(self, build: type[PeriodicTaskConfig], known: Known) -> None:
        """Build valid rows as ``build`` (the manager's entry class, adopted without a copy), and
        after the first full read reuse ``known(row_id)`` for a row whose revision it holds."""
        ...

    def judge_stored(self, raw: Sequence[Any]) -> PeriodicTaskConfig | RowError:
        """Judge a stored copy of a row (a last good version read back from a runtime store:
        ``raw`` as a row) exactly as this provider judges rows: it is data like any other."""
        ...


@runtime_checkable
class DigestingProvider(IncrementalProvider, Protocol):
    """An incremental provider that can tell, with one cheap question, that nothing was written
    since its last full read: a full reconcile due at rest then stands as that read left it."""

    async def unchanged_since_full(self) -> bool:
        """Whether the rows a full read would go through now are exactly those of the last full
        read, over the same scope, with no change read since (False when it cannot tell).
        Raises ProviderError when the source cannot be read (a failed sync)."""
        ...


@dataclass(frozen=True, slots=True)
class PartitionsHeld:
    """The partitions a manager holds now, out of ``count`` (the rows of ``pm_partitions``)."""

    count: int
    partitions: frozenset[int]

    @property
    def every(self) -> bool:
        """Every partition is held (a manager alone): reads need no partition filter."""
        return every_partition(self.partitions, self.count)


# The partitions a partitioned provider reads, asked at each read.
HeldPartitions = Callable[[], PartitionsHeld]


@runtime_checkable
class PartitionedProvider(ConfigProvider, Protocol):
    """A provider that can read only the rows of some partitions (``PM_COORDINATION=partitions``)."""

    def restrict(self, held: HeldPartitions) -> None:
        """From now on every read (full, changes) covers only the rows of the partitions
        ``held()`` names at the time of the read."""
        ...

    async def get_partitions(self, partitions: frozenset[int]) -> ProviderSnapshot:
        """Every enabled row of ``partitions`` (configs and row errors), read in full."""
        ...
