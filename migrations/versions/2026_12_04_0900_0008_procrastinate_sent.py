"""The procrastinate target's idempotency keys: ``pm_procrastinate_sent``.

One row per task inserted into procrastinate's ``procrastinate_jobs``, written in the same
transaction as the job: the primary key on the idempotency key makes each slot one job, whichever
manager sends it. ``expires_at`` (indexed) lets the target prune keys no manager may send again; ``name`` with
``job_id`` (indexed) finds a schedule's newest job, whose status in ``procrastinate_jobs`` tells
``options.overlap`` skip and hold whether it finished (``task_id`` and ``enqueued_at`` describe it).
The table is created on SQLite too (the target itself refuses SQLite: procrastinate is PostgreSQL
only), so both backends keep one schema.

Revision ID: 0008_procrastinate_sent
Revises: 0007_ids_last_good
Create Date: 2026-12-04 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from periodic_manager.migrations import dialect

revision: str = "0008_procrastinate_sent"
down_revision: str | None = "0007_ids_last_good"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pm_procrastinate_sent",
        sa.Column("idempotency_key", sa.String(length=300), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("task_id", sa.String(length=36), nullable=False),
        sa.Column("enqueued_at", dialect.INSTANT, nullable=False),
        sa.Column("expires_at", dialect.INSTANT, nullable=False),
        sa.PrimaryKeyConstraint("idempotency_key"),
        **dialect.TABLE,
    )
    op.create_index("ix_pm_procrastinate_sent_expires_at", "pm_procrastinate_sent", ["expires_at"])
    op.create_index(
        "ix_pm_procrastinate_sent_name_job_id", "pm_procrastinate_sent", ["name", "job_id"]
    )


def downgrade() -> None:
    op.drop_index("ix_pm_procrastinate_sent_name_job_id", table_name="pm_procrastinate_sent")
    op.drop_index("ix_pm_procrastinate_sent_expires_at", table_name="pm_procrastinate_sent")
    op.drop_table("pm_procrastinate_sent")
