"""options.max_runs: how many slots of a limited schedule were sent.

- ``pm_schedule_state.runs_count``: distinct slots of a schedule with ``options.max_runs``
  recorded sent (enqueued, found enqueued already, re-published) after the settled slot of their
  time, written in the same statement as ``last_done_at`` (see periodic_manager/schedules/runs.py).

Plain ALTER TABLE on both backends.

Revision ID: 0013_max_runs
Revises: 0012_change_history
Create Date: 2026-12-06 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013_max_runs"
down_revision: str | None = "0012_change_history"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE pm_schedule_state ADD COLUMN runs_count BIGINT DEFAULT '0' NOT NULL")


def downgrade() -> None:
    op.execute("ALTER TABLE pm_schedule_state DROP COLUMN runs_count")
