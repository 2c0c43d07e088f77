"""Run history: pm_runs (one row per slot outcome or manual trigger).

Revision ID: 0002_runs_history
Revises: 5667209b3cef
Create Date: 2026-11-30 10:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from periodic_manager.migrations import dialect

revision: str = "0002_runs_history"
down_revision: str | None = "5667209b3cef"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pm_runs",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("schedule_key", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("slot_at", dialect.INSTANT, nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("at", dialect.INSTANT, nullable=False),
        sa.Column("lateness_ms", sa.BigInteger(), nullable=False),
        sa.Column("message_id", sa.String(length=128), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pm_runs")),
        **dialect.TABLE,
    )
    with op.batch_alter_table("pm_runs", schema=None) as batch_op:
        batch_op.create_index("ix_pm_runs_schedule_key_slot_at", ["schedule_key", "slot_at"])
        batch_op.create_index("ix_pm_runs_at", ["at"])


def downgrade() -> None:
    with op.batch_alter_table("pm_runs", schema=None) as batch_op:
        batch_op.drop_index("ix_pm_runs_at")
        batch_op.drop_index("ix_pm_runs_schedule_key_slot_at")
    op.drop_table("pm_runs")
