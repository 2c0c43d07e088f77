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

The contract, and what databases share, is :mod:`.base`.

Adding a database: a module here implementing :class:`Database`, one entry in
:data:`DATABASES`, and its migrations' branches (``migrations/dialect.py``).
"""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.db.dialects import mysql, postgresql, sqlite
from periodic_manager.db.dialects.base import LEADER_LOCK_NAME, Database, lock_key

__all__ = [
    "DATABASES",
    "LEADER_LOCK_NAME",
    "Database",
    "backend_name",
    "database_of",
    "database_on",
    "lock_key",
]


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
