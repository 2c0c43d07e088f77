"""Cron engine speed: ours vs cronsim vs croniter, side by side in one run.

    .venv/bin/python bench/cron_bench.py | tee bench/cron_bench.txt

1. Next-slot throughput (the scheduler's hot call: next slot after the previous slot) on
   the issue's mix, in UTC and Europe/Berlin. Each library walks the same slots from
   2024-01-01 (each walk stays within about a century), after one untimed warm-up walk;
   iterator construction is not timed; best of 3 trials. Targets: >= 5x cronsim and
   >= 10x croniter per call. The libraries differ in DST semantics (see
   docs/cron.md §12); only speed is compared here.
2. Parse + first slot for 100,000 schedules drawn from 1,000 distinct expressions in
   10 zones, from cold caches. Target: under 1 s.

croniter and cronsim are dev-only dependencies, used here and nowhere else.
"""

from __future__ import annotations

import gc
import random
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from croniter import croniter  # noqa: E402
from cronsim import CronSim  # noqa: E402

from periodic_manager import cron  # noqa: E402

MIX = [
    "*/5 * * * *",
    "0 6 * * *",
    "30 8 * * mon-fri",
    "0 0 1 * *",
    "15 2 * * *",
    "0 0 29 2 *",
    "0 9-17/2 * * 1-5",
    "@hourly",
]
# cronsim has no macros; it gets the expansion.
CRONSIM_EXPR = {"@hourly": "0 * * * *"}
# Slots per walk, so that every walk stays within about a century of 2024.
WALK = {"0 0 1 * *": 1000, "0 0 29 2 *": 24}
DEFAULT_WALK = 2000
CALLS = 6000  # per (library, expression, zone) and trial
TRIALS = 3
START = datetime(2024, 1, 1, tzinfo=UTC)
TARGETS = {"cronsim": 5.0, "croniter": 10.0}


def walk_ours(expr: str, tz: str, n: int) -> Callable[[], float]:
    sched = cron.parse(expr, tz)

    def run() -> float:
        t = START
        t0 = time.perf_counter()
        for _ in range(n):
            t = sched.next_after(t)
        return time.perf_counter() - t0

    return run


def walk_cronsim(expr: str, tz: str, n: int) -> Callable[[], float]:
    start = START.astimezone(ZoneInfo(tz))
    expr = CRONSIM_EXPR.get(expr, expr)

    def run() -> float:
        it = CronSim(expr, start)
        t0 = time.perf_counter()
        for _ in range(n):
            next(it)
        return time.perf_counter() - t0

    return run


def walk_croniter(expr: str, tz: str, n: int) -> Callable[[], float]:
    start = START.astimezone(ZoneInfo(tz))

    def run() -> float:
        it = croniter(expr, start)
        t0 = time.perf_counter()
        for _ in range(n):
            it.get_next(datetime)
        return time.perf_counter() - t0

    return run


def per_call_us(make: Callable[[str, str, int], Callable[[], float]], expr: str, tz: str) -> float:
    """Best-of-TRIALS microseconds per call over about CALLS calls."""
    n = WALK.get(expr, DEFAULT_WALK)
    reps = max(1, CALLS // n)
    run = make(expr, tz, n)
    run()  # warm-up: caches (ours: zone tables; others: whatever they keep) filled once
    best = float("inf")
    for _ in range(TRIALS):
        gc.collect()
        best = min(best, sum(run() for _ in range(reps)) / (reps * n))
    return best * 1e6


def verdict(ratio: float, target: float) -> str:
    return "PASS" if ratio >= target else "MISS"


def throughput() -> bool:
    print("1. Next-slot throughput, microseconds per call (best of 3, warm)")
    head = f"{'expression':<18} {'zone':<14} {'ours':>7} {'cronsim':>8} {'croniter':>9} {'x cronsim':>10} {'x croniter':>11}"
    print(head)
    print("-" * len(head))
    ok = True
    for tz in ("UTC", "Europe/Berlin"):
        totals = [0.0, 0.0, 0.0]
        for expr in MIX:
            us = [per_call_us(f, expr, tz) for f in (walk_ours, walk_cronsim, walk_croniter)]
            totals = [a + b for a, b in zip(totals, us, strict=True)]
            r1, r2 = us[1] / us[0], us[2] / us[0]
            flags = f"{verdict(r1, TARGETS['cronsim'])}/{verdict(r2, TARGETS['croniter'])}"
            print(
                f"{expr:<18} {tz:<14} {us[0]:>7.2f} {us[1]:>8.2f} {us[2]:>9.2f}"
                f" {r1:>9.1f}x {r2:>10.1f}x  {flags}"
            )
        r1, r2 = totals[1] / totals[0], totals[2] / totals[0]
        mix_ok = r1 >= TARGETS["cronsim"] and r2 >= TARGETS["croniter"]
        ok = ok and mix_ok
        print(
            f"{'whole mix (sum)':<18} {tz:<14} {totals[0]:>7.2f} {totals[1]:>8.2f} {totals[2]:>9.2f}"
            f" {r1:>9.1f}x {r2:>10.1f}x  target >=5x / >=10x: {'PASS' if mix_ok else 'MISS'}"
        )
        print()
    print("(cronsim runs '0 * * * *' for @hourly: it has no macros)")
    return ok


ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "America/Sao_Paulo",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "Asia/Kathmandu",
    "Antarctica/Troll",
    "Asia/Tokyo",
    "America/Los_Angeles",
]


def distinct_expressions(rng: random.Random, count: int) -> list[str]:
    """Realistic, valid, distinct expressions (fixed seed: the same set every run)."""
    dows = ["*", "1-5", "mon-fri", "0,6", "sat,sun", "1", "*/2", "2-4"]
    forms: list[Callable[[], str]] = [
        lambda: f"{rng.randrange(60)} {rng.randrange(24)} * * *",
        lambda: (
            f"*/{rng.choice([1, 2, 5, 10, 15, 20, 30])} {rng.choice(['*', '8-18', '*/2'])} * * {rng.choice(dows)}"
        ),
        lambda: f"{rng.randrange(60)} {rng.randrange(24)} * * {rng.choice(dows)}",
        lambda: f"{rng.randrange(60)} {rng.randrange(24)} {rng.randrange(1, 29)} * *",
        lambda: (
            f"{rng.randrange(60)} {rng.randrange(24)} {rng.randrange(1, 29)} {rng.randrange(1, 13)} *"
        ),
        lambda: (
            f"{rng.randrange(60)} {rng.randrange(6, 10)}-{rng.randrange(16, 21)}/{rng.randrange(1, 4)} * * 1-5"
        ),
        lambda: f"{rng.randrange(60)} */{rng.randrange(1, 13)} * * *",
        lambda: (
            f"{rng.randrange(0, 60, 15)},{rng.randrange(0, 60, 15)} {rng.randrange(24)},{rng.randrange(24)} * * *"
        ),
        lambda: f"@every {rng.randrange(1, 300)}m",
        lambda: rng.choice(["@hourly", "@daily", "@weekly", "@monthly", "@yearly"]),
    ]
    out: dict[str, None] = {}
    while len(out) < count:
        expr = rng.choice(forms)()
        try:
            cron.validate(expr)
        except cron.CronError:
            continue
        out[expr] = None
    return list(out)


def parse_and_first_slot() -> bool:
    print(
        "2. Parse + first slot, 100,000 schedules (1,000 distinct expressions x 10 zones), cold caches"
    )
    rng = random.Random(20240331)
    exprs = distinct_expressions(rng, 1000)
    draws = [(rng.choice(exprs), rng.choice(ZONES)) for _ in range(100_000)]
    ok = True
    for label, now in (
        ("ordinary instant", datetime(2025, 1, 15, 9, 41, 17, 123456, tzinfo=UTC)),
        ("EU spring-forward", datetime(2025, 3, 30, 0, 30, tzinfo=UTC)),
    ):
        best = float("inf")
        for _ in range(TRIALS):
            cron.clear_caches()
            gc.collect()
            t0 = time.perf_counter()
            for expr, tz in draws:
                cron.parse(expr, tz).next_after(now)
            best = min(best, time.perf_counter() - t0)
        passed = best < 1.0
        ok = ok and passed
        print(
            f"   now = {now.isoformat()} ({label}): {best:.3f} s"
            f" ({best * 1e6 / len(draws):.2f} us/schedule)  target < 1 s: {'PASS' if passed else 'MISS'}"
        )
    return ok


def main() -> None:
    print(f"Python {sys.version.split()[0]}; cronsim and croniter from the dev dependencies")
    print()
    ok1 = throughput()
    print()
    ok2 = parse_and_first_slot()
    print()
    print(
        f"throughput targets: {'PASS' if ok1 else 'MISS'}; parse + first slot target: {'PASS' if ok2 else 'MISS'}"
    )


if __name__ == "__main__":
    main()
