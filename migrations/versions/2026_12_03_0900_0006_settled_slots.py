"""Nothing sent twice, whichever broker forgets: what the database knows of each schedule's slots.

- ``pm_schedule_state.last_done_at``: the latest slot whose fate is settled for good (enqueued,
  found enqueued already, re-published, or skipped). A takeover and a catch-up never send a slot
  at or before it, even when the broker's claims are gone (a Redis restarted without persistence).
- ``pm_schedule_state.resent_count``: slots re-published with the same task id because the
  broker never confirmed the first publish (a delivery that may have happened twice).

Plain ALTER TABLE on every backend.

Revision ID: 0006_settled_slots
Revises: 0005_overlap
Create Date: 2026-12-03 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from periodic_manager.migrations import dialect

revision: str = "0006_settled_slots"
down_revision: str | None = "0005_overlap"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    instant = dialect.instant_sql()
    op.execute(f"ALTER TABLE pm_schedule_state ADD COLUMN last_done_at {instant}")
    op.execute("ALTER TABLE pm_schedule_state ADD COLUMN resent_count BIGINT DEFAULT '0' NOT NULL")
    # What was sent before this migration is settled too.
    op.execute("UPDATE pm_schedule_state SET last_done_at = last_slot_at")


def downgrade() -> None:
    op.execute("ALTER TABLE pm_schedule_state DROP COLUMN resent_count")
    op.execute("ALTER TABLE pm_schedule_state DROP COLUMN last_done_at")
