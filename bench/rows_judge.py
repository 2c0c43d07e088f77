"""Cost per row of judging ``periodic_jobs`` rows (periodic_manager/db/judge.py), without the
database: what a full read pays in Python for each row after the driver delivered it.

    .venv/bin/python bench/rows_judge.py | tee bench/rows_judge.txt

Rows are shaped as each backend's reader delivers them (PostgreSQL: text and booleans, epoch
text for timestamps; SQLite: raw bytes), 100,000 distinct rows per kind, cron caches cleared
before each trial, best of 3. ``judge`` is the manager's path; ``view`` is the API's (a page
of at most 500 rows): it decodes every column for display on top of judging.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from periodic_manager import cron  # noqa: E402
from periodic_manager.db import judge as dbjudge  # noqa: E402
from periodic_manager.db import rows as dbrows  # noqa: E402
from periodic_manager.db import view as dbview  # noqa: E402

N = 100_000
TRIALS = 3


def good(i: int) -> tuple[Any, ...]:
    return (
        i,
        True,
        f"job.{i}",
        f"{i % 60} * * * *",
        "Europe/Berlin",
        None,
        "reports.build",
        f'{{"format": "pdf", "n": {i}}}',
        '{"queue": "reports", "max_retry": 3}',
        "1764547200.000000",  # effective_at
        "a description",
        "1764547200.000000",
        "1764547200.000000",
    )


def every(i: int) -> tuple[Any, ...]:
    row = list(good(i))
    row[3], row[5] = f"@every {i % 600 + 1}s", "1704067200.250000"
    return tuple(row)


def bad_options(i: int) -> tuple[Any, ...]:
    row = list(good(i))
    row[8] = '{"misfire": "fire_once", "catchup_window": 1e300}'
    return tuple(row)


def deep_payload(i: int) -> tuple[Any, ...]:
    row = list(good(i))
    row[7] = "[" * 150 + str(i) + "]" * 150
    return tuple(row)


def as_sqlite(row: tuple[Any, ...]) -> tuple[Any, ...]:
    out: list[Any] = [row[0], b"1"]
    for k, v in enumerate(row[2:], start=2):
        if v is not None and dbrows.FIELDS[k] in (
            "anchor",
            "effective_at",
            "created_at",
            "updated_at",
        ):
            v = "2025-12-01 00:00:00.000000"
        out.append(v.encode() if isinstance(v, str) else v)
    return tuple(out)


def timed(fn: Callable[[tuple[Any, ...]], object], rows: list[tuple[Any, ...]]) -> float:
    best = float("inf")
    for _ in range(TRIALS):
        cron.clear_caches()
        gc.collect()
        t0 = time.perf_counter()
        for r in rows:
            fn(r)
        best = min(best, time.perf_counter() - t0)
    return best / len(rows) * 1e6


def main() -> None:
    kinds = {
        "cron, valid": good,
        "@every + anchor, valid": every,
        "bad catchup_window": bad_options,
        "payload nested 150 deep": deep_payload,
    }
    print(f"{'row kind':<26} {'backend':<11} {'judge us/row':>13} {'view us/row':>12}")
    for label, make in kinds.items():
        for backend in ("postgresql", "sqlite"):
            sqlite = backend == "sqlite"
            rows = [make(i) for i in range(N)]
            if sqlite:
                rows = [as_sqlite(r) for r in rows]
            rules = dbjudge.Rules(sqlite)
            judged = timed(lambda r, rules=rules: dbjudge.judge(rules, r), rows)
            viewed = timed(lambda r, rules=rules: dbview.view(rules, r), rows[:5000])
            print(f"{label:<26} {backend:<11} {judged:>13.1f} {viewed:>12.1f}")


if __name__ == "__main__":
    main()
