"""What backfills sent, one row per slot: ``pm_backfill_slots``.

A backfill read what was sent once, at its start, and trusted the target's claims for the rest:
two backfills of one range (API and CLI, different rates) sent the slots whose claims had expired
in between twice, and a backfilled slot was known only to the run history, which keeps the
newest slots of a schedule (a backfill's are its oldest). A backfill now claims each slot in this
table (unique on schedule_key, slot_at) just before sending it, so of two racing backfills only
one sends it, and the slot stays known as sent for PM_RUNS_RETENTION (pruned with the history by
``at``).

Revision ID: 0024_backfill_slots
Revises: 0023_takeover_locks
Create Date: 2026-12-12 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from periodic_manager.migrations import dialect

revision: str = "0024_backfill_slots"
down_revision: str | None = "0023_takeover_locks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pm_backfill_slots",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("schedule_key", sa.String(length=128), nullable=False),
        sa.Column("slot_at", dialect.INSTANT, nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("at", dialect.INSTANT, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pm_backfill_slots")),
        sa.UniqueConstraint(
            "schedule_key", "slot_at", name=op.f("uq_pm_backfill_slots_schedule_key_slot_at")
        ),
        **dialect.TABLE,
    )
    op.create_index("ix_pm_backfill_slots_at", "pm_backfill_slots", ["at"])


def downgrade() -> None:
    op.drop_index("ix_pm_backfill_slots_at", table_name="pm_backfill_slots")
    op.drop_table("pm_backfill_slots")
