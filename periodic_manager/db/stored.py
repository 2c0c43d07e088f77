"""Rows as stored: every column of a ``periodic_jobs`` row read back in its stored form, and
written back the same, byte for byte (``export`` and ``import`` of rows with errors, see
:mod:`periodic_manager.schedules.as_stored` for how files carry them).

A stored value is its bytes and, on SQLite, whether it is held as a BLOB (:data:`Raw`).
PostgreSQL instants are read as their text in UTC and ISO style (``10000-01-01 00:00:00+00``,
``infinity``): the judge reads epoch seconds, which cannot be written back exactly. Writing a
column as stored goes past its type: no JSON encoding, no instant conversion (:func:`bind`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, DateTime, LargeBinary, Text, cast, func, literal, select, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.db import rows as dbrows
from periodic_manager.db import view as dbview
from periodic_manager.db.engine import backend, reads_bytes
from periodic_manager.db.judge import Rules
from periodic_manager.db.models import jobs_table

# The columns a stored row may give as stored (the columns people see; the id and effective_at
# are the database's own).
COLUMNS = (
    "name",
    "spec",
    "task_type",
    "timezone",
    "payload",
    "options",
    "enabled",
    "description",
    "anchor",
    "created_at",
    "updated_at",
)
INSTANTS = ("anchor", "created_at", "updated_at")
JSON_COLUMNS = ("payload", "options")

# A stored value as files carry it: its bytes, and whether SQLite holds it as a BLOB.
Raw = tuple[bytes, bool]


# -- reading ------------------------------------------------------------------------------------


def extras(db: str) -> list[ColumnElement[Any]]:
    """Columns read beside :func:`dbrows.columns` to give each column's stored form: SQLite, the
    storage class of each column (a BLOB stays a BLOB); PostgreSQL, the text of each instant (the
    judge reads epoch seconds, which cannot be written back exactly); MariaDB/MySQL, none (every
    column is read as the bytes of its text, instants as UTC ``DATETIME`` text)."""
    t = jobs_table.c
    if db == "sqlite":
        return [func.typeof(t[c]).label(f"typeof_{c}") for c in COLUMNS]
    if db == "mysql":
        return []
    return [cast(t[c], Text).label(f"text_{c}") for c in INSTANTS]


async def prepare(conn: AsyncConnection, db: str) -> None:
    """Fix how PostgreSQL writes instants as text for this transaction (UTC, ISO style), so the
    same stored instant always reads as the same text."""
    if db == "postgresql":
        await conn.execute(text("SET LOCAL TimeZone = 'UTC'"))
        await conn.execute(text("SET LOCAL DateStyle = 'ISO, YMD'"))


@dataclass(slots=True)
class StoredRow:
    """A row as :func:`dbview.view` shows it, and each column's stored form (:meth:`raw`)."""

    view: dbview.RowView
    more: tuple[Any, ...]  # the values of extras(), in order
    db: str  # engine.backend()

    def raw(self, column: str) -> Raw | None:
        """The stored form of ``column`` (None: SQL NULL)."""
        value = self.view.raw[dbrows.FIELDS.index(column)]
        if value is None:
            return None
        if self.db == "sqlite":
            return bytes(value), self.more[COLUMNS.index(column)] == "blob"
        if self.db == "mysql":
            return bytes(value), False
        if column in INSTANTS:
            value = self.more[INSTANTS.index(column)]
        elif isinstance(value, bool):
            value = "true" if value else "false"
        return str(value).encode(), False


async def read_stored(engine: AsyncEngine, rules: Rules) -> list[StoredRow]:
    """Every row, read raw and judged like the API judges it (whatever a row holds), with each
    column's stored form."""
    db = backend(engine)
    query = select(*dbrows.columns(reads_bytes(engine), display=True), *extras(db))
    n = len(dbrows.FIELDS)
    async with engine.connect() as conn:
        await prepare(conn, db)
        raws = (await conn.execute(query.order_by(jobs_table.c.id))).all()
    return [StoredRow(dbview.view(rules, tuple(r[:n])), tuple(r[n:]), db) for r in raws]


def column_length(column: str) -> int | None:
    """The most characters ``column`` holds (None: no limit)."""
    limit: int | None = getattr(jobs_table.c[column].type, "length", None)
    return limit


# -- writing --------------------------------------------------------------------------------------


def bind(column: str, raw: Raw, db: str) -> ColumnElement[Any]:
    """The SQL value that stores ``raw`` in ``column`` as it was stored: past the column's type
    (no JSON encoding, no instant conversion). ``db``: :func:`engine.backend`."""
    data, blob = raw
    if db == "sqlite":
        # A BLOB stays a BLOB; text is stored as text (and gets the column's affinity, as it did
        # where it was read).
        return literal(data, LargeBinary) if blob else literal(data.decode("utf-8"), Text)
    stored = literal(data.decode("utf-8"), Text)
    if db == "mysql":  # MariaDB/MySQL turn text into the column's type themselves
        return stored
    if column in JSON_COLUMNS:
        return cast(stored, JSONB)
    if column in INSTANTS:
        return cast(stored, DateTime(timezone=True))
    return stored
