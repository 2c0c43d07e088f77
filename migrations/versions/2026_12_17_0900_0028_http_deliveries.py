"""The deliveries of the http target: ``pm_http_deliveries``.

One row per slot sent to an HTTP receiver, unique on the idempotency key: pending (due at
``next_attempt_at``, leased by the manager delivering it), done (the receiver answered 2xx) or
dead (attempts or age exhausted, or a permanent answer: the dead letters, replayable).

Revision ID: 0028_http_deliveries
Revises: 0027_run_reason
Create Date: 2026-12-17 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from periodic_manager.migrations import dialect

revision: str = "0028_http_deliveries"
down_revision: str | None = "0027_run_reason"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pm_http_deliveries",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("idempotency_key", sa.String(length=300), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("slot_at", dialect.INSTANT, nullable=False),
        sa.Column("host", sa.String(length=300), nullable=False),
        sa.Column("request", dialect.LONG_TEXT, nullable=False),
        sa.Column("body", dialect.LONG_TEXT, nullable=False),
        sa.Column("state", sa.String(length=8), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", dialect.INSTANT, nullable=False),
        sa.Column("next_attempt_at", dialect.INSTANT, nullable=False),
        sa.Column("locked_by", sa.String(length=64), nullable=True),
        sa.Column("locked_until", dialect.INSTANT, nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_body", sa.Text(), nullable=True),
        sa.Column("finished_at", dialect.INSTANT, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pm_http_deliveries")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_pm_http_deliveries_idempotency_key")),
        sqlite_autoincrement=True,
        **dialect.TABLE,
    )
    op.create_index("ix_pm_http_deliveries_due", "pm_http_deliveries", ["state", "next_attempt_at"])
    op.create_index("ix_pm_http_deliveries_name_id", "pm_http_deliveries", ["name", "id"])


def downgrade() -> None:
    op.drop_index("ix_pm_http_deliveries_name_id", table_name="pm_http_deliveries")
    op.drop_index("ix_pm_http_deliveries_due", table_name="pm_http_deliveries")
    op.drop_table("pm_http_deliveries")
