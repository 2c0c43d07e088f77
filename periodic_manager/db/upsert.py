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

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.db.dialects import database_on
from periodic_manager.db.dialects.base import Assign, Where


def upsert(
    bind: AsyncEngine | AsyncConnection,
    table: Table,
    keys: Sequence[str],
    assign: Assign,
    where: Where | None = None,
) -> Any:
    """An INSERT into ``table`` that, when a row with the same ``keys`` is there, updates it as
    ``assign`` says (only where ``where`` holds, given the new row's columns): the statement of
    the database ``bind`` talks to (:meth:`~periodic_manager.db.dialects.Database.upsert`)."""
    return database_on(bind).upsert(table, keys, assign, where)
