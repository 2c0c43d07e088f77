"""Whether a partition member holds its liveness lock: ``pm_partition_members.liveness_lock``.

With ``PM_COORDINATION=partitions`` every manager holds a session-level advisory lock on its
lease connection, keyed by its member id (:mod:`periodic_manager.runtime.liveness_lock`).
PostgreSQL frees it when that session ends, a SIGKILLed or OOM-killed process's included, and
the other managers take a member's leases at once when its lock is free instead of at the lease
TTL. Only a member that said it holds its lock is judged by it: every lease round writes
``liveness_lock`` (whether the round's own session holds the member's lock, read by the database),
so a manager of an older version, or one whose lock is held elsewhere for a moment, keeps the
lease TTL as its only bound. Not null, default false; plain ALTER TABLE on every backend (the
table exists on all of them, leases are PostgreSQL's only).

Revision ID: 0023_takeover_locks
Revises: 0022_partition_first_held
Create Date: 2026-12-12 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023_takeover_locks"
down_revision: str | None = "0022_partition_first_held"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "pm_partition_members",
        sa.Column("liveness_lock", sa.Boolean(), server_default=sa.false(), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("pm_partition_members", "liveness_lock")
