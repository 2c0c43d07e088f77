"""Partitions: ``pm_partitions`` (one row per partition, its lease) and ``pm_partition_members``.

With ``PM_COORDINATION=partitions`` every manager leases a share of the partitions and holds only
the schedules of those (a schedule's partition is its id modulo the partition count,
:mod:`periodic_manager.schedules.partition`). The partition count is a property of the database:
this migration makes ``PM_PARTITIONS`` rows (default 64, 1..4096), read from the environment or
from the Alembic config attribute ``partitions``. Changing it later means stopping every manager
and re-creating the rows (docs/operations.md, "Partitions").

Revision ID: 0010_partitions
Revises: 0009_pause_note
Create Date: 2026-12-06 09:00:00+00:00
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

from periodic_manager.migrations import dialect
from periodic_manager.schedules.partition import DEFAULT_PARTITIONS, check_count

revision: str = "0010_partitions"
down_revision: str | None = "0009_pause_note"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def partition_count() -> int:
    """PM_PARTITIONS from the Alembic config (``partitions``), else the environment, else 64."""
    value = context.config.attributes.get("partitions") or os.environ.get("PM_PARTITIONS")
    return DEFAULT_PARTITIONS if value in (None, "") else check_count(value)


def upgrade() -> None:
    count = partition_count()
    op.create_table(
        "pm_partitions",
        sa.Column("partition", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=True),
        sa.Column("epoch", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("expires_at", dialect.INSTANT, nullable=True),
        sa.Column("renewed_at", dialect.INSTANT, nullable=True),
        sa.PrimaryKeyConstraint("partition"),
        **dialect.TABLE,
    )
    op.create_table(
        "pm_partition_members",
        sa.Column("member", sa.String(length=64), nullable=False),
        sa.Column("expires_at", dialect.INSTANT, nullable=False),
        sa.PrimaryKeyConstraint("member"),
        **dialect.TABLE,
    )
    table = sa.table("pm_partitions", sa.column("partition", sa.Integer()))
    op.bulk_insert(table, [{"partition": p} for p in range(count)])


def downgrade() -> None:
    op.drop_table("pm_partition_members")
    op.drop_table("pm_partitions")
