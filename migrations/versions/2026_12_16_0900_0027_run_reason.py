"""Why each slot was skipped, held or failed: ``pm_runs.reason``.

The run history keeps the reason of every outcome that has one, from one closed list
(:data:`periodic_manager.contracts.SlotReason`: late, excluded, overlap, refused, target-down,
...), so a schedule's stats count its slots by reason (``GET /schedules/{id}/stats``) as the
metrics do. Null for the rows written before (and for outcomes without a reason). Nullable, no
default, no index (read with the schedule's key and ``slot_at``); plain ALTER TABLE everywhere.

Revision ID: 0027_run_reason
Revises: 0026_clock_offset
Create Date: 2026-12-16 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0027_run_reason"
down_revision: str | None = "0026_clock_offset"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE pm_runs ADD COLUMN reason VARCHAR(32)")


def downgrade() -> None:
    op.execute("ALTER TABLE pm_runs DROP COLUMN reason")
