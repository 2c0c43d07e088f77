"""Dashboard benchmark: every endpoint the pages read, and every page in Chromium, with 10,000
schedules, on SQLite and on PostgreSQL.

Data per backend: 10,000 schedules (``tests/support/browser.py`` ``schedule_rows``: six kinds of spec in
four zones, a tenth paused), 60,000 history rows in the last hour (statuses and lateness spread),
one live leader holding 10,000 entries of which 100 are rejected rows. The server is a real
``periodic-manager api`` process (heartbeat interval 1 h, so the seeded manager stays live).

* **server**: HTTP round trip on loopback (server time plus well under a millisecond), after two
  warm-up calls: median, p95 and max of ``--repeat`` calls, and the server process's CPU time per
  call (from /proc: it does not grow when other processes load the machine, wall time does); the
  first call after start is given apart for the list sorted by next slot (it reads every row and
  the cron engine parses each spec once per process).
* **browser**: from navigation start to the page drawn (the script's ``pm-rendered`` mark: shell,
  modules, token check, data, DOM), median and max of ``--loads`` loads in headless Chromium.

Run from the repository root (PostgreSQL of PM_TEST_PG_DSN, Chromium from Debian)::

    .venv/bin/python bench/ui_bench.py [--repeat 20] [--loads 5] [--out bench/ui_bench.txt]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from periodic_manager.db.migrate import upgrade_sync  # noqa: E402
from tests import browser  # noqa: E402

PG_DSN = os.environ.get("PM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432")
SCHEDULES = 10_000
RUNS = 60_000
BUDGET_MS = 300
ENDPOINTS = [
    ("list, by next slot (page 1)", "/views/schedules?limit=50"),
    ("list, by next slot (last page)", "/views/schedules?limit=50&offset=9950"),
    ("list, name prefix", "/views/schedules?name_prefix=bulk.01"),
    ("list, queue", "/views/schedules?queue=q1"),
    ("list, task type + enabled", "/views/schedules?task_type=task.2&enabled=true"),
    ("list, in error", "/views/schedules?in_error=true"),
    ("list, by name", "/views/schedules?sort=name"),
    ("public list by id (for comparison)", "/schedules?limit=50"),
    ("schedule detail", "/schedules/{id}"),
    ("next 10 slots, DST marked", "/views/schedules/{id}/slots?n=10"),
    ("run history (20)", "/schedules/{id}/runs?limit=20"),
    ("entries of the schedule", "/entries?schedule_id={id}"),
    ("overview", "/views/overview"),
    ("managers", "/views/managers"),
    ("entries page", "/views/entries?limit=50"),
    ("live preview (/cron/next)", "/cron/next?spec=30%202%20*%20*%20*&tz=Europe/Berlin&n=5"),
]
PAGES = [
    ("overview", "/ui"),
    ("schedules", "/ui/schedules"),
    ("schedules, filtered", "/ui/schedules?queue=q1&enabled=true"),
    ("schedules, page 200", "/ui/schedules?page=200"),
    ("one schedule", "/ui/schedules/{id}"),
    ("edit form", "/ui/schedules/{id}/edit"),
    ("managers", "/ui/managers"),
]
DETAIL_ID = 3  # a Europe/Berlin daily schedule (row 2 of schedule_rows)


def run_rows(now: datetime) -> list[tuple[Any, ...]]:
    """(key, name, slot_at, status, at, lateness_ms, error) spread over the last hour."""
    rows = []
    statuses = ["enqueued"] * 17 + ["skipped", "failed", "duplicate"]
    for i in range(RUNS):
        key = str(i % SCHEDULES + 1)
        slot = now - timedelta(seconds=3590 * i / RUNS + 5)
        lateness = (i * 37) % 250 + (5_000 if i % 1000 == 0 else 0)
        status = statuses[i % len(statuses)]
        rows.append(
            (
                key,
                f"bulk.{int(key) - 1:05d}",
                slot,
                status,
                slot + timedelta(milliseconds=lateness),
                lateness,
                "enqueue failed" if status == "failed" else None,
            )
        )
    return rows


def entry_rows(now: datetime) -> list[tuple[Any, ...]]:
    """(entry_id, key, name, status, spec, zone, queue, last_error) for every schedule."""
    out = []
    for i, (name, spec, zone, _, _, _, _) in enumerate(browser.schedule_rows(SCHEDULES)):
        bad = i % 100 == 7
        out.append(
            (
                f"e{i + 1}",
                str(i + 1),
                name,
                "error" if bad else "active",
                spec,
                zone,
                f"q{i % 3}",
                "spec: rejected for the benchmark" if bad else None,
            )
        )
    return out


def seed_sqlite(db: Path, now: datetime) -> None:
    import sqlite3

    def text(dt: datetime) -> str:
        return dt.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")

    browser.seed_sqlite(db, SCHEDULES)
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO pm_managers (manager_id, hostname, pid, version, started_at, heartbeat_at,"
            " is_leader, last_sync_at, entry_count) VALUES ('bench-1', 'bench', 1, '0.1.0', ?, ?, 1,"
            " ?, ?)",
            (text(now - timedelta(hours=2)), text(now), text(now), SCHEDULES),
        )
        conn.executemany(
            "INSERT INTO pm_entries (manager_id, entry_id, schedule_key, name, content_hash, status,"
            " spec, timezone, queue, last_error, registered_at) VALUES ('bench-1', ?, ?, ?, ?, ?,"
            " ?, ?, ?, ?, ?)",
            [
                (e, k, n, "ab" * 32, st, sp, z, q, err, text(now))
                for e, k, n, st, sp, z, q, err in entry_rows(now)
            ],
        )
        conn.executemany(
            "INSERT INTO pm_runs (schedule_key, name, slot_at, status, at, lateness_ms, error)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(k, n, text(s), st, text(a), lat, err) for k, n, s, st, a, lat, err in run_rows(now)],
        )


async def seed_pg(url: str, now: datetime) -> None:
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        rows = browser.schedule_rows(SCHEDULES)
        await conn.execute(
            "INSERT INTO periodic_jobs (name, spec, timezone, task_type, payload, options, enabled)"
            " SELECT n, s, z, t, p::jsonb, o::jsonb, e FROM unnest($1::text[], $2::text[],"
            " $3::text[], $4::text[], $5::text[], $6::text[], $7::bool[]) AS r(n, s, z, t, p, o, e)",
            *[list(column) for column in zip(*rows, strict=True)],
        )
        await conn.execute(
            "INSERT INTO pm_managers (manager_id, hostname, pid, version, started_at, heartbeat_at,"
            " is_leader, last_sync_at, entry_count) VALUES ('bench-1', 'bench', 1, '0.1.0', $1, $2,"
            " true, $2, $3)",
            now - timedelta(hours=2),
            now,
            SCHEDULES,
        )
        await conn.executemany(
            "INSERT INTO pm_entries (manager_id, entry_id, schedule_key, name, content_hash, status,"
            " spec, timezone, queue, last_error, registered_at) VALUES ('bench-1', $1, $2, $3, $4,"
            " $5, $6, $7, $8, $9, $10)",
            [
                (e, k, n, "ab" * 32, st, sp, z, q, err, now)
                for e, k, n, st, sp, z, q, err in entry_rows(now)
            ],
        )
        await conn.executemany(
            "INSERT INTO pm_runs (schedule_key, name, slot_at, status, at, lateness_ms, error)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7)",
            run_rows(now),
        )
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_endpoints(
    base: str, pid: int, repeat: int
) -> list[tuple[str, str, float, float, float, float]]:
    """Per endpoint: label, path, median, p95, max (ms, wall) and the server's CPU ms per call."""
    out = []
    with httpx.Client(base_url=base, timeout=30) as client:
        first = time.perf_counter()
        r = client.get("/views/schedules?limit=50")
        cold_ms = (time.perf_counter() - first) * 1000
        assert r.status_code == 200 and r.json()["total"] == SCHEDULES, r.text[:300]
        out.append(
            (
                "list, by next slot: first call after start",
                "/views/schedules",
                cold_ms,
                cold_ms,
                cold_ms,
                float("nan"),
            )
        )
        for label, path in ENDPOINTS:
            path = path.format(id=DETAIL_ID)
            for _ in range(2):
                r = client.get(path)
                assert r.status_code == 200, (path, r.status_code, r.text[:300])
            samples = []
            cpu0 = cpu_s(pid)
            for _ in range(repeat):
                t0 = time.perf_counter()
                r = client.get(path)
                samples.append((time.perf_counter() - t0) * 1000)
                assert r.status_code == 200
            cpu_ms = (cpu_s(pid) - cpu0) * 1000 / repeat
            samples.sort()
            p95 = samples[min(len(samples) - 1, round(0.95 * len(samples)) - 1)]
            out.append((label, path, statistics.median(samples), p95, samples[-1], cpu_ms))
    return out


def time_pages(base: str, loads: int) -> list[tuple[str, str, float, float]]:
    out = []
    with browser.chromium() as d:
        for label, path in PAGES:
            path = path.format(id=DETAIL_ID)
            samples = []
            for i in range(loads + 1):
                d.get(base + path)
                for _ in range(600):
                    mark = d.execute_script(
                        "const m = performance.getEntriesByName('pm-rendered');"
                        "return m.length ? m[0].startTime : null;"
                    )
                    if mark is not None:
                        break
                    time.sleep(0.01)
                assert mark is not None, f"{path} never rendered"
                error = d.find_elements("css selector", "main p.error")
                assert not [e for e in error if e.text], (path, error[0].text)
                if i:  # the first load fills the browser's cache
                    samples.append(float(mark))
            out.append((label, path, statistics.median(samples), max(samples)))
    return out


def bench_backend(name: str, url: str, repeat: int, loads: int) -> tuple[list, list]:
    with browser.Server(url, "api", PM_HEARTBEAT_INTERVAL="3600") as server:
        assert server.process is not None
        endpoints = time_endpoints(server.base, server.process.pid, repeat)
        pages = time_pages(server.base, loads)
    return endpoints, pages


def report(
    results: dict[str, tuple[list, list]], repeat: int, loads: int, load_start: float
) -> str:
    lines = [
        "Dashboard benchmark (bench/ui_bench.py): 10,000 schedules, 60,000 runs in the last hour,",
        "one live manager with 10,000 entries (100 rejected); a `periodic-manager api` process.",
        f"machine: {os.cpu_count()} CPUs, {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}; commit {commit()}",
        f"budget: every page under {BUDGET_MS} ms; 1-minute load average {load_start:.1f} at the "
        f"start, {os.getloadavg()[0]:.1f} at the end (the machine is shared: wall times vary)",
        "",
        f"Server: HTTP round trip on loopback, ms (median / p95 / max of {repeat}, after 2 "
        "warm-ups), and the server process's CPU ms per call (load-independent; 10 ms ticks)",
    ]
    names = list(results)
    header = f"{'endpoint':44}" + "".join(f"{n:>31}" for n in names)
    lines += [header, "-" * len(header)]
    for i, (label, *_) in enumerate(results[names[0]][0]):
        cells = []
        for n in names:
            _, _, med, p95, worst, cpu = results[n][0][i]
            cpu_text = "" if cpu != cpu else f"{cpu:5.1f}"
            cells.append(f"{med:6.1f} /{p95:6.1f} /{worst:6.1f} | {cpu_text:>5}")
        lines.append(f"{label[:44]:44}" + "".join(f"{c:>31}" for c in cells))
    lines += ["", f"Browser: navigation start to page drawn, ms (median / max of {loads} loads)"]
    header = f"{'page':44}" + "".join(f"{n:>31}" for n in names)
    lines += [header, "-" * len(header)]
    for i, (label, path, *_) in enumerate(results[names[0]][1]):
        cells = [f"{results[n][1][i][2]:7.1f} /{results[n][1][i][3]:7.1f}" for n in names]
        lines.append(f"{(label + ' ' + path)[:44]:44}" + "".join(f"{c:>31}" for c in cells))
    worst_page = max(p[3] for n in names for p in results[n][1])
    worst_api = max(e[4] for n in names for e in results[n][0][1:])
    worst_cpu = max(e[5] for n in names for e in results[n][0][1:])
    lines += [
        "",
        f"worst page drawn: {worst_page:.0f} ms; worst warm endpoint call: {worst_api:.0f} ms, "
        f"most server CPU per call {worst_cpu:.0f} ms "
        f"({'within' if max(worst_page, worst_api) < BUDGET_MS else 'OVER'} the {BUDGET_MS} ms budget)",
    ]
    return "\n".join(lines)


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if (why := browser.missing()) is not None:
        sys.exit(why)
    results: dict[str, tuple[list, list]] = {}
    load_start = os.getloadavg()[0]
    now = datetime.now(UTC)
    if args.backend in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "pm.db"
            url = f"sqlite:///{db}"
            upgrade_sync(url)
            seed_sqlite(db, now)
            results["SQLite"] = bench_backend("SQLite", url, args.repeat, args.loads)
    if args.backend in ("postgresql", "both"):
        name = f"pm_bench_ui_{uuid.uuid4().hex[:8]}"
        subprocess.run(
            ["psql", f"{PG_DSN}/postgres", "-qc", f'CREATE DATABASE "{name}"'], check=True
        )
        try:
            url = f"{PG_DSN}/{name}"
            upgrade_sync(url)
            asyncio.run(seed_pg(url, datetime.now(UTC)))
            results["PostgreSQL"] = bench_backend("PostgreSQL", url, args.repeat, args.loads)
        finally:
            subprocess.run(
                [
                    "psql",
                    f"{PG_DSN}/postgres",
                    "-qc",
                    f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
                ],
                check=True,
            )
    text = report(results, args.repeat, args.loads, load_start)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
