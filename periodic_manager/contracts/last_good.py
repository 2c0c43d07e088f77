"""Last good versions: what a runtime store offers to keep running the version of a schedule that
was good before its row turned bad (``runtime.last_good``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "LastGoodVersion",
    "StoredVersion",
    "LastGoodStore",
]


@dataclass(frozen=True, slots=True)
class LastGoodVersion:
    """A version to store: the entry's content, and when and at which revision the row was bad."""

    schedule_key: str
    name: str
    spec: str
    timezone: str
    anchor: datetime | None
    task_type: str
    payload_json: str
    options_json: str
    effective_at: datetime | None
    content_hash: str
    row_revision: int | None  # the revision of the good row it was read from
    bad_revision: int | None  # the revision at which the row was seen bad
    since: datetime
    manager_id: str


@dataclass(frozen=True, slots=True)
class StoredVersion:
    """A version read back, untrusted: ``raw`` holds its content columns in the raw form of a
    ``periodic_jobs`` row (``dbrows.CONTENT`` then ``effective_at``), for the row judge."""

    schedule_key: str
    raw: tuple[Any, ...]
    since: datetime | None  # None: unreadable
    bad_revision: int | None


@runtime_checkable
class LastGoodStore(Protocol):
    """What a runtime store offers to keep last good versions (``DatabaseRuntimeStore`` does)."""

    async def save_last_good(self, versions: Sequence[LastGoodVersion]) -> None:
        """Insert or replace each version, unless the stored one was seen bad at a later
        revision; an unchanged content keeps its ``since``."""
        ...

    async def last_good_index(self) -> dict[str, int | None]:
        """The keys that have a stored version, each with its ``bad_revision``."""
        ...

    async def load_last_good(self, keys: Sequence[str]) -> list[StoredVersion]:
        """The stored versions of ``keys`` (absent keys are missing)."""
        ...

    async def forget_last_good(self, keys: Sequence[str], revision: int | None) -> None:
        """Delete the versions of ``keys`` seen bad at or before ``revision`` (None: any)."""
        ...
