"""INSERT .. or update on every database: ON CONFLICT DO UPDATE on PostgreSQL and SQLite, ON
DUPLICATE KEY UPDATE on MariaDB/MySQL. The runtime store's one way of writing a row that may be
there already.

MariaDB/MySQL assign the columns in order, each assignment seeing the columns assigned before it
(PostgreSQL and SQLite see the stored row in every one). So :data:`Assign` gives an ordered list,
and a column that a later assignment (or the ``where`` condition) reads from the stored row is
assigned after it. A ``where`` condition becomes, there, a choice per column between the new
value and the stored one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Table, case
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.db.engine import backend

# The new row's columns (``excluded`` / ``inserted``) -> (column name, value) in order.
Assign = Callable[[Any], Sequence[tuple[str, Any]]]
Where = Callable[[Any], ColumnElement[bool]]


def upsert(
    bind: AsyncEngine | AsyncConnection,
    table: Table,
    keys: Sequence[str],
    assign: Assign,
    where: Where | None = None,
) -> Any:
    """An INSERT into ``table`` that, when a row with the same ``keys`` is there, updates it as
    ``assign`` says (only where ``where`` holds, given the new row's columns)."""
    db = backend(bind)
    # Each dialect's insert is imported by a process on that database only.
    if db == "mysql":
        from sqlalchemy.dialects import mysql

        stmt = mysql.insert(table)
        new = stmt.inserted
        pairs = list(assign(new))
        if where is not None:
            cond = where(new)
            pairs = [(name, case((cond, value), else_=table.c[name])) for name, value in pairs]
        return stmt.on_duplicate_key_update(pairs)
    if db not in ("postgresql", "sqlite"):
        raise ValueError(f"unsupported database {db!r}: use postgresql, mysql/mariadb or sqlite")
    ins: Any
    if db == "postgresql":
        from sqlalchemy.dialects import postgresql

        ins = postgresql.insert(table)
    else:
        from sqlalchemy.dialects import sqlite

        ins = sqlite.insert(table)
    new = ins.excluded
    return ins.on_conflict_do_update(
        index_elements=[table.c[k] for k in keys],
        set_=dict(assign(new)),
        where=None if where is None else where(new),
    )
