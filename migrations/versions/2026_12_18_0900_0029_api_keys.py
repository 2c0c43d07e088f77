"""API keys with scopes: ``pm_api_keys``.

One row per key: its id (the public part of ``pmk_<id>_<secret>``), a unique name, the namespace
it is of (``default`` until namespaces come), its scope (read, trigger, write, admin), the SHA-256
of its secret (the key itself is shown once and never stored), when it was made, when it expires
and was revoked (null: never), and when it was last used (written at most once a minute). Read by
primary key on every request that carries a key.

Revision ID: 0029_api_keys
Revises: 0028_http_deliveries
Create Date: 2026-12-18 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from periodic_manager.migrations import dialect

revision: str = "0029_api_keys"
down_revision: str | None = "0028_http_deliveries"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pm_api_keys",
        sa.Column("key_id", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("namespace", sa.String(length=64), server_default="default", nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("secret_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", dialect.INSTANT, nullable=False),
        sa.Column("expires_at", dialect.INSTANT, nullable=True),
        sa.Column("revoked_at", dialect.INSTANT, nullable=True),
        sa.Column("last_used_at", dialect.INSTANT, nullable=True),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_pm_api_keys")),
        sa.UniqueConstraint("name", name=op.f("uq_pm_api_keys_name")),
        **dialect.TABLE,
    )


def downgrade() -> None:
    op.drop_table("pm_api_keys")
