"""The contract of a database (:class:`Database`, with what most databases share as its
defaults), the leader lock of a dedicated session, and the shapes of an upsert's assignments.
The registry is :mod:`periodic_manager.db.dialects`."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, Protocol

from sqlalchemy import ColumnElement, Table
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

# The new row's columns (``excluded`` / ``inserted``) -> (column name, value) in order.
Assign = Callable[[Any], Sequence[tuple[str, Any]]]
Where = Callable[[Any], ColumnElement[bool]]

# How a manager learns that rows changed: LISTEN on a connection of its own, a poll of the
# change revision, or nothing (one process: its own writes sync at once).
ChangeSignalKind = Literal["listen", "poll"] | None

# The lock of PM_COORDINATION=leader: PostgreSQL's advisory lock on its key (:func:`lock_key`),
# MariaDB/MySQL's named lock derived from it and the database's name.
LEADER_LOCK_NAME = "periodic_manager:leader"


def lock_key(name: str) -> int:
    """A signed 64-bit advisory-lock key derived from ``name``."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


class SessionLock(Protocol):
    """A lock that lives as long as one dedicated session (never a pooled one): the server
    frees it when the session ends, the process's death included. ``conn`` is what
    :meth:`connect` returned, the driver's own connection."""

    async def connect(self) -> Any:
        """A new dedicated connection whose server ends it once silent for the lock's timeout."""
        ...

    async def try_lock(self, conn: Any) -> bool:
        """Take the lock on ``conn`` without waiting; whether it is now held."""
        ...

    async def prove(self, conn: Any) -> None:
        """A round trip on ``conn`` proving the session (and so the lock) is alive; raises
        when it is not."""
        ...

    async def close(self, conn: Any) -> None:
        """Close ``conn`` politely (the server frees the lock)."""
        ...

    def terminate(self, conn: Any) -> None:
        """Drop ``conn`` at once, without a round trip."""
        ...


def on_conflict_update(
    ins: Any, table: Table, keys: Iterable[str], assign: Assign, where: Where | None
) -> Any:
    """``ins`` (PostgreSQL's or SQLite's INSERT) updating the row with the same ``keys``:
    ``ON CONFLICT (keys) DO UPDATE`` (both see the stored row in every assignment)."""
    new = ins.excluded
    return ins.on_conflict_do_update(
        index_elements=[table.c[k] for k in keys],
        set_=dict(assign(new)),
        where=None if where is None else where(new),
    )


class Database(Protocol):
    """One database: what the rest of the package may ask of it (the registry's module doc).
    A database subclasses it and keeps the defaults that fit: a driver shipped with the
    package, no leader election, no change signal, no partitions, untrusted columns read as
    their stored bytes."""

    name: str  # the registry's key: postgresql, mysql (MariaDB too) or sqlite
    label: str  # as people name it, in messages
    schemes: tuple[str, ...]  # the URL schemes it accepts
    driver: str  # the async driver's scheme
    change_signal: ChangeSignalKind = None
    partitions: bool = False  # partition leases (PM_COORDINATION=partitions)
    elects_leader: bool = False  # leader election is possible, and on by default
    reads_bytes: bool = True  # untrusted columns are read as their stored bytes (db.rows)

    def check_driver(self) -> None:
        """ValueError (one line naming what to install) when its driver is missing."""
        return None

    def driver_url(self, url: URL) -> URL:
        """``url`` with the async driver this package uses."""
        return url.set(drivername=self.driver)

    def engine(self, url: str, *, command_timeout: float, ping: bool, **kwargs: Any) -> AsyncEngine:
        """An engine on ``url`` (already a :meth:`driver_url`) with this database's settings."""
        ...

    def leader_lock(self, url: str, *, name: str, timeout: float) -> SessionLock:
        """The leader lock ``name`` on a dedicated session, which the server ends once silent
        for ``timeout``; ValueError where there is none."""
        raise ValueError(
            f"leader election needs a database with a leader lock; run one manager on {self.label}"
        )

    def upsert(self, table: Table, keys: Iterable[str], assign: Assign, where: Where | None) -> Any:
        """An INSERT into ``table`` that updates the row with the same ``keys`` as ``assign``
        says (only where ``where`` holds, given the new row's columns)."""
        ...
