"""options.pause_after_failures: how many tasks of a schedule failed in a row.

- ``pm_schedule_state.consecutive_failures``: the schedule's failed tasks in a row;
- ``pm_schedule_state.failures_checked_at``: the slot of the last task counted (the count goes
  on from the runs after it; see periodic_manager/schedules/failures.py).

Plain ALTER TABLE on both backends.

Revision ID: 0015_pause_on_failure
Revises: 0013_max_runs
Create Date: 2026-12-07 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from periodic_manager.migrations import dialect

revision: str = "0015_pause_on_failure"
down_revision: str | None = "0013_max_runs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    instant = dialect.instant_sql()
    op.execute(
        "ALTER TABLE pm_schedule_state ADD COLUMN consecutive_failures BIGINT DEFAULT '0' NOT NULL"
    )
    op.execute(f"ALTER TABLE pm_schedule_state ADD COLUMN failures_checked_at {instant}")


def downgrade() -> None:
    op.execute("ALTER TABLE pm_schedule_state DROP COLUMN failures_checked_at")
    op.execute("ALTER TABLE pm_schedule_state DROP COLUMN consecutive_failures")
