"""The parts of the :class:`~periodic_manager.db.dialects.Database` contract that its modules
share: the leader lock of a dedicated session, and the shapes of an upsert's assignments."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, Protocol

from sqlalchemy import ColumnElement, Table

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
