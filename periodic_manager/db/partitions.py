"""The partition table as the API sees it, and the partition rule in SQL.

:func:`partition_sql` is :func:`periodic_manager.schedules.partition.partition_of` written as a
SQL expression (``id % n``, the same number in PostgreSQL and SQLite for the positive ids rows
have). The leases themselves are taken and renewed by :mod:`periodic_manager.runtime.partitions`
on a connection of its own.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from periodic_manager.db.models import partitions_table


def partition_sql(column: ColumnElement[Any], count: Any) -> ColumnElement[Any]:
    """The partition of the row whose id is ``column`` out of ``count`` (a bind or a number)."""
    return column % count


async def partition_count(conn: AsyncConnection) -> int:
    """How many partitions the database has (its rows of ``pm_partitions``)."""
    return int(
        (await conn.execute(select(func.count()).select_from(partitions_table))).scalar_one()
    )


async def holders(conn: AsyncConnection) -> dict[str, list[int]]:
    """The partitions each holder's lease names, by holder (ascending); a lease past its
    ``expires_at`` still names its holder until another manager takes it."""
    rows = await conn.execute(
        select(partitions_table.c.holder, partitions_table.c.partition)
        .where(partitions_table.c.holder.is_not(None))
        .order_by(partitions_table.c.partition)
    )
    held: dict[str, list[int]] = {}
    for holder, partition in rows:
        # Written by SQL too: a value that is not what the lease module writes is left out.
        if isinstance(holder, str) and isinstance(partition, int):
            held.setdefault(holder, []).append(partition)
    return held
