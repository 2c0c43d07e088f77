"""Each manager's wall clock against the database's: ``pm_managers.clock_offset_s``.

A manager measures how far its wall clock is from the database's (``SELECT now()`` bracketed by
two local readings, or the ``now()`` of its lease rounds, :mod:`periodic_manager.runtime.
clock_offset`) and writes the seconds it is ahead (negative: behind) with every heartbeat, so
the managers page and ``GET /managers`` show a clock that is off. Null: not measured (SQLite,
or a manager older than this migration). Nullable, no default; plain ALTER TABLE everywhere.

Revision ID: 0026_clock_offset
Revises: 0025_target_down
Create Date: 2026-12-12 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from periodic_manager.migrations import dialect

revision: str = "0026_clock_offset"
down_revision: str | None = "0025_target_down"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    add = "ALTER TABLE pm_managers ADD COLUMN clock_offset_s"
    dialect.run(
        postgresql=[f"{add} DOUBLE PRECISION"], sqlite=[f"{add} DOUBLE"], mysql=[f"{add} DOUBLE"]
    )


def downgrade() -> None:
    op.execute("ALTER TABLE pm_managers DROP COLUMN clock_offset_s")
