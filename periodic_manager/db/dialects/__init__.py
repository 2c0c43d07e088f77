"""What differs between the databases, behind one contract: :class:`Database`.

One module per database implements it (:mod:`.postgresql`, :mod:`.mysql` for MariaDB and
MySQL, :mod:`.sqlite`), and :data:`DATABASES` is the one registry, by the name SQLAlchemy gives
the database's backend. Code outside ``db/`` asks :func:`database_of` (a URL) or
:func:`database_on` (an engine or a connection) which database it talks to, and what that
database can do, instead of comparing names:

* its engine (drivers, pool and session settings: :meth:`Database.engine`);
* leader election, a lock that lives as long as one dedicated session
  (:meth:`Database.leader_lock`, a :class:`SessionLock`; on by default where it exists);
* how the manager learns that rows changed (:attr:`Database.change_signal`: LISTEN/NOTIFY,
  a poll of the change revision, or nothing: one process);
* partition leases (:attr:`Database.partitions`; their statements are
  :mod:`periodic_manager.db.leases`, PostgreSQL's);
* an INSERT that updates the row already there (:meth:`Database.upsert`).

Adding a database: a module here implementing :class:`Database`, one entry in
:data:`DATABASES`, and its migrations' branches (``migrations/dialect.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from sqlalchemy import Table
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.db.dialects import mysql, postgresql, sqlite
from periodic_manager.db.dialects.base import (
    LEADER_LOCK_NAME,
    Assign,
    ChangeSignalKind,
    SessionLock,
    Where,
    lock_key,
)

__all__ = [
    "DATABASES",
    "LEADER_LOCK_NAME",
    "Assign",
    "ChangeSignalKind",
    "Database",
    "SessionLock",
    "Where",
    "backend_name",
    "database_of",
    "database_on",
    "lock_key",
]


class Database(Protocol):
    """One database: what the rest of the package may ask of it (module doc)."""

    name: str  # the registry's key: postgresql, mysql (MariaDB too) or sqlite
    label: str  # as people name it, in messages
    schemes: tuple[str, ...]  # the URL schemes it accepts
    change_signal: ChangeSignalKind
    partitions: bool  # partition leases (PM_COORDINATION=partitions)
    elects_leader: bool  # leader election is possible, and on by default
    reads_bytes: bool  # untrusted columns are read as their stored bytes (db.rows)

    def check_driver(self) -> None:
        """ValueError (one line naming what to install) when its driver is missing."""
        ...

    def driver_url(self, url: URL) -> URL:
        """``url`` with the async driver this package uses."""
        ...

    def engine(self, url: str, *, command_timeout: float, ping: bool, **kwargs: Any) -> AsyncEngine:
        """An engine on ``url`` (already a :meth:`driver_url`) with this database's settings."""
        ...

    def leader_lock(self, url: str, *, name: str, timeout: float) -> SessionLock:
        """The leader lock ``name`` on a dedicated session, which the server ends once silent
        for ``timeout``; ValueError where there is none."""
        ...

    def upsert(self, table: Table, keys: Iterable[str], assign: Assign, where: Where | None) -> Any:
        """An INSERT into ``table`` that updates the row with the same ``keys`` as ``assign``
        says (only where ``where`` holds, given the new row's columns)."""
        ...


DATABASES: dict[str, Database] = {
    db.name: db for db in (postgresql.DATABASE, mysql.DATABASE, sqlite.DATABASE)
}
# The other names SQLAlchemy gives a backend we speak to.
_ALIASES = {"mariadb": "mysql"}


def backend_name(backend: str) -> str:
    """The registry's name of SQLAlchemy's ``backend`` (MariaDB is ``mysql``); any other name
    as it is."""
    return _ALIASES.get(backend, backend)


def _named(backend: str) -> Database:
    name = backend_name(backend)
    if name not in DATABASES:
        *first, last = (d.label for d in DATABASES.values())
        raise ValueError(f"unsupported database {backend!r}: use {', '.join(first)} or {last}")
    return DATABASES[name]


def database_of(url: str | URL) -> Database:
    """The database ``url`` names; ValueError (one line naming the supported ones) otherwise."""
    return _named(make_url(url).get_backend_name())


def database_on(bind: AsyncEngine | AsyncConnection) -> Database:
    """The database ``bind`` talks to; ValueError as :func:`database_of`."""
    return _named(bind.dialect.name)
