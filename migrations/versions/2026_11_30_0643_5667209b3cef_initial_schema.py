"""Initial schema: periodic_jobs, managers, entries, schedule state, outbox.

Revision ID: 5667209b3cef
Revises:
Create Date: 2026-11-30 06:43:34.788677+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from periodic_manager.migrations import dialect

revision: str = "5667209b3cef"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "periodic_jobs",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("spec", sa.String(length=200), nullable=False),
        sa.Column("timezone", sa.String(length=64), server_default="UTC", nullable=False),
        sa.Column("anchor", dialect.INSTANT, nullable=True),
        sa.Column("task_type", sa.String(length=200), nullable=False),
        sa.Column(
            "payload",
            dialect.JSON_VALUE,
            nullable=True,
        ),
        sa.Column(
            "options",
            dialect.JSON_VALUE,
            server_default="{}",
            nullable=False,
        ),
        sa.Column("enabled", sa.Boolean(), server_default=sa.true(), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("created_at", dialect.INSTANT, server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", dialect.INSTANT, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_periodic_jobs")),
        sa.UniqueConstraint("name", name=op.f("uq_periodic_jobs_name")),
        **dialect.TABLE,
    )
    op.create_table(
        "pm_managers",
        sa.Column("manager_id", sa.String(length=64), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(length=32), nullable=False),
        sa.Column("started_at", dialect.INSTANT, nullable=False),
        sa.Column("heartbeat_at", dialect.INSTANT, nullable=False),
        sa.Column("is_leader", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("last_sync_at", dialect.INSTANT, nullable=True),
        sa.Column("last_sync_error", sa.Text(), nullable=True),
        sa.Column("entry_count", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("manager_id", name=op.f("pk_pm_managers")),
        **dialect.TABLE,
    )
    op.create_table(
        "pm_outbox",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("task_id", sa.String(length=36), nullable=False),
        sa.Column("idempotency_key", sa.String(length=300), nullable=False),
        sa.Column("queue", sa.String(length=100), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("task_type", sa.String(length=200), nullable=False),
        sa.Column("payload", dialect.LONG_TEXT, nullable=False),
        sa.Column("options", dialect.LONG_TEXT, nullable=False),
        sa.Column("scheduled_at", dialect.INSTANT, nullable=False),
        sa.Column("enqueued_at", dialect.INSTANT, nullable=False),
        sa.Column("processed_at", dialect.INSTANT, nullable=True),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_pm_outbox")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_pm_outbox_idempotency_key")),
        **dialect.TABLE,
    )
    with op.batch_alter_table("pm_outbox", schema=None) as batch_op:
        batch_op.create_index(
            "ix_pm_outbox_pending", ["queue", "processed_at", "seq"], unique=False
        )

    op.create_table(
        "pm_schedule_state",
        sa.Column("schedule_key", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("last_slot_at", dialect.INSTANT, nullable=True),
        sa.Column("last_enqueued_at", dialect.INSTANT, nullable=True),
        sa.Column("last_message_id", sa.String(length=128), nullable=True),
        sa.Column("last_status", sa.String(length=16), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("enqueued_count", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("duplicate_count", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("skipped_count", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("failed_count", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("updated_at", dialect.INSTANT, nullable=False),
        sa.PrimaryKeyConstraint("schedule_key", name=op.f("pk_pm_schedule_state")),
        **dialect.TABLE,
    )
    op.create_table(
        "pm_entries",
        sa.Column("manager_id", sa.String(length=64), nullable=False),
        sa.Column("entry_id", sa.String(length=128), nullable=False),
        sa.Column("schedule_key", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.String(length=200), nullable=True),
        sa.Column("timezone", sa.String(length=64), nullable=True),
        sa.Column("anchor", dialect.INSTANT, nullable=True),
        sa.Column("task_type", sa.String(length=200), nullable=True),
        sa.Column("queue", sa.String(length=100), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("registered_at", dialect.INSTANT, nullable=False),
        sa.ForeignKeyConstraint(
            ["manager_id"],
            ["pm_managers.manager_id"],
            name=op.f("fk_pm_entries_manager_id_pm_managers"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("manager_id", "entry_id", name=op.f("pk_pm_entries")),
        **dialect.TABLE,
    )
    with op.batch_alter_table("pm_entries", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_pm_entries_schedule_key"), ["schedule_key"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("pm_entries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_pm_entries_schedule_key"))

    op.drop_table("pm_entries")
    op.drop_table("pm_schedule_state")
    with op.batch_alter_table("pm_outbox", schema=None) as batch_op:
        batch_op.drop_index("ix_pm_outbox_pending")

    op.drop_table("pm_outbox")
    op.drop_table("pm_managers")
    op.drop_table("periodic_jobs")
