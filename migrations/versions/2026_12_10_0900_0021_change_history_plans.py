"""Change history on PostgreSQL: each statement's rows are planned for that statement's size.

0012's statement trigger ran its INSERT .. SELECT as static SQL inside PL/pgSQL, whose plan is
cached for the session: a plan made while the transition tables held one row (after a few
single-row updates) paired 20,000 old and new rows by a nested loop, and a 20,000-row UPDATE took
about a minute (a 200,000-row one, hours). The trigger now runs the same statements through
``EXECUTE``, planned every time with the real row count of the transition tables, and with JIT
off (compiling the large expression cost about a second per statement, single-row ones included).
What is recorded is unchanged. SQLite and MariaDB/MySQL use row triggers: nothing changes there.
Downgrade restores 0012's function.

Revision ID: 0021_change_history_plans
Revises: 0017_partition_signal
Create Date: 2026-12-10 09:00:00+00:00
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from periodic_manager.migrations import dialect

revision: str = "0021_change_history_plans"
down_revision: str | None = "0017_partition_signal"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_0012 = importlib.import_module(
    "periodic_manager.migrations.versions.2026_12_06_0900_0012_change_history"
)
_STATIC = "SELECT id, left(name, 200), at, action, src, left(who, 200), diff::text"
_BOUND = "SELECT id, left(name, 200), $1, action, $2, left($3, 200), diff::text"


def _dynamic(function: str) -> str:
    """0012's function with each INSERT run by EXECUTE (its variables bound) and JIT off."""
    head, sep, body = function.partition("LANGUAGE plpgsql AS $$")
    assert sep and body.count(_STATIC) == 3, "0012's function is not the one this rewrites"
    lines = []
    for line in body.splitlines():
        if _STATIC in line:
            statement = line.strip().rstrip(";").replace(_STATIC, _BOUND)
            indent = line[: len(line) - len(line.lstrip())]
            line = f"{indent}EXECUTE $sql${statement}$sql$ USING at, src, who;"
        lines.append(line)
    return f"{head.replace('CREATE FUNCTION', 'CREATE OR REPLACE FUNCTION')}LANGUAGE plpgsql SET jit = off AS $${chr(10).join(lines)}"


def upgrade() -> None:
    dialect.run(postgresql=[_dynamic(_0012.PG_UP[0])], sqlite=(), mysql=())


def downgrade() -> None:
    restored = _0012.PG_UP[0].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    dialect.run(postgresql=[restored], sqlite=(), mysql=())  # its SET jit goes with it
