"""A stand-in for what :class:`periodic_manager.runtime.metrics.ManagerMetrics` reads of a
manager (:class:`~periodic_manager.runtime.metrics.ManagerView`): a leader holding partitions,
synced, with the entries given."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

SYNCED_AT = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


@dataclass
class Config:
    queue: str
    options: dict[str, Any]


@dataclass
class Entry:
    key: str
    config: Config


@dataclass
class View:
    by_key: dict[str, Entry] = field(default_factory=dict)
    default_target: str = "redis"
    is_leader: bool = True
    last_sync_at: datetime | None = SYNCED_AT
    last_sync_error: str | None = None
    partitions: frozenset[int] = frozenset(range(8))
    partition_handovers: int = 0
    signals_ignored: int = 0
    standing_down: str | None = None
    stand_downs: int = 0
    clock_offset_s: float | None = 0.01

    def entries(self) -> list[Entry]:
        return list(self.by_key.values())

    def entry(self, key: str) -> Entry | None:
        return self.by_key.get(key)
