"""Why a manager holds no work: ``pm_managers.target_down``.

A manager whose every target fails its pings (``PM_TARGET_PING_FAILURES`` in a row) stands down:
it takes no partition and hands over those it holds, or steps down as leader
(:mod:`periodic_manager.runtime.target_health`). Its heartbeat writes why here (one line naming
the targets and their errors; null while it may hold work), and ``/managers`` and the dashboard's
managers page show it. Nullable text, no default: a row written before this migration, or by a
manager of an older version, reads as null. Plain ALTER TABLE on every backend.

Revision ID: 0025_target_down
Revises: 0024_backfill_slots
Create Date: 2026-12-12 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025_target_down"
down_revision: str | None = "0024_backfill_slots"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("pm_managers", sa.Column("target_down", sa.Text(), nullable=True))


def downgrade() -> None:
    op.execute("ALTER TABLE pm_managers DROP COLUMN target_down")
