"""When each partition was first held: ``pm_partitions.first_held_at``.

With ``PM_COORDINATION=partitions`` a partition no manager held before starts as a first start
does (its schedules' first slots come after their registration), and any later takeover looks
back up to the grace window (:mod:`periodic_manager.runtime.partitions`). At a cluster's first
start the first manager is alone, takes every partition and hands most of them over a round
later: the next holders looked back the full grace and sent slots due before any manager held
the partition, which nobody owes. ``first_held_at`` records the instant of a partition's first
take (the taking manager's clock, the clock its first slots were judged by); a takeover looks
back no further than that.

The lease TAKE writes it when it takes a partition whose epoch is 0 (never held) and leaves it
as it is afterwards. Rows held before this migration keep a null value: held before the instant
was recorded, their takeovers look back the full grace as before. Nullable, no default; plain
ALTER TABLE on every backend (the table exists on all of them, leases are PostgreSQL's only).

Revision ID: 0022_partition_first_held
Revises: 0021_change_history_plans
Create Date: 2026-12-11 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from periodic_manager.migrations import dialect

revision: str = "0022_partition_first_held"
down_revision: str | None = "0021_change_history_plans"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(f"ALTER TABLE pm_partitions ADD COLUMN first_held_at {dialect.instant_sql()}")


def downgrade() -> None:
    op.execute("ALTER TABLE pm_partitions DROP COLUMN first_held_at")
