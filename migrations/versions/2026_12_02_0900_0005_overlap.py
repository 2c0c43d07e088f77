"""options.overlap: what managers publish about held slots and previous tasks; the outbox's
newest row per schedule.

- ``pm_entries``: ``held_slot_at`` (the slot a manager holds while the schedule's previous task
  runs), ``previous_task_id`` and ``previous_task_state`` (that task, as last seen).
- ``pm_schedule_state``: ``held_count``, beside the other counters.
- ``pm_outbox``: index ``(name, seq)``, so the newest row of a schedule is one index lookup.

Plain ALTER TABLE on every backend (SQLite's batch mode would rebuild tables).

Revision ID: 0005_overlap
Revises: 0004_effective_at
Create Date: 2026-12-02 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from periodic_manager.migrations import dialect

revision: str = "0005_overlap"
down_revision: str | None = "0004_effective_at"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    instant = dialect.instant_sql()
    op.execute(f"ALTER TABLE pm_entries ADD COLUMN held_slot_at {instant}")
    op.execute("ALTER TABLE pm_entries ADD COLUMN previous_task_id VARCHAR(128)")
    op.execute("ALTER TABLE pm_entries ADD COLUMN previous_task_state VARCHAR(32)")
    op.execute("ALTER TABLE pm_schedule_state ADD COLUMN held_count BIGINT DEFAULT '0' NOT NULL")
    op.create_index("ix_pm_outbox_name_seq", "pm_outbox", ["name", "seq"])


def downgrade() -> None:
    op.drop_index("ix_pm_outbox_name_seq", table_name="pm_outbox")
    op.execute("ALTER TABLE pm_schedule_state DROP COLUMN held_count")
    for column in ("previous_task_state", "previous_task_id", "held_slot_at"):
        op.execute(f"ALTER TABLE pm_entries DROP COLUMN {column}")
