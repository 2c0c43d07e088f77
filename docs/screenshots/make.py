"""Screenshots of every dashboard page, for docs/dashboard.md (run from the repository root)::

    .venv/bin/python docs/screenshots/make.py [--out docs/screenshots]

Starts ``periodic-manager run`` (API and manager) on a fresh SQLite file, creates sample
schedules through the API (one of them a row written with SQL that the manager rejects), triggers
one, and adds an hour of sample run history (synthetic: the overview's chart needs an hour) so
every page has something to show; then drives headless Chromium at desktop and phone widths and
saves one PNG per page.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests import browser  # noqa: E402

SAMPLES = [
    {
        "name": "reports.daily",
        "spec": "30 2 * * *",
        "timezone": "Europe/Berlin",
        "task_type": "reports.build",
        "payload": {"format": "pdf"},
        "options": {"queue": "reports"},
        "description": "Nightly PDF reports for every customer",
    },
    {
        "name": "berlin.march-sundays",
        "spec": "30 2 * 3 0",
        "timezone": "Europe/Berlin",
        "task_type": "reports.build",
        "options": {"queue": "reports"},
        "description": "The last Sunday of March has no 02:30 in Berlin: that run is shifted",
    },
    {
        "name": "billing.monthly",
        "spec": "0 6 1 * *",
        "timezone": "America/New_York",
        "task_type": "billing.invoice",
        "options": {"queue": "billing", "max_retry": 5},
    },
    {"name": "cache.warm", "spec": "@every 90s", "task_type": "cache.warm"},
    {
        "name": "digest.weekday",
        "spec": "0 9 * * 1-5",
        "timezone": "Asia/Kolkata",
        "task_type": "mail.digest",
        "options": {"queue": "mail"},
    },
    {
        "name": "db.cleanup",
        "spec": "0 3 * * *",
        "task_type": "db.cleanup",
        "enabled": False,
        "payload": {"days": 30},
        "options": {"queue": "maintenance"},
    },
]
DESKTOP = (1280, 900)
PHONE = (390, 844)


def sample_history(db: Path, ids: dict[str, int]) -> None:
    """An hour of runs for the sample schedules (synthetic, like a quiet afternoon)."""
    now = datetime.now(UTC)
    rows = []
    for minute in range(60):
        at = now - timedelta(minutes=60 - minute)
        for n in range(3 + (minute * 7) % 5):
            name = "cache.warm" if n % 2 else "reports.daily"
            status = (
                "failed"
                if (minute, n) == (41, 0)
                else "skipped"
                if minute % 23 == 5 and n == 1
                else "held"
                if minute % 17 == 9 and n == 2
                else "enqueued"
            )
            lateness = 4 + (minute * 13 + n * 7) % 40 + (2500 if status == "skipped" else 0)
            slot = at + timedelta(seconds=n * 7)
            rows.append(
                (
                    str(ids[name]),
                    name,
                    slot,
                    status,
                    slot + timedelta(milliseconds=lateness),
                    lateness,
                    "redis: connection refused" if status == "failed" else None,
                )
            )

    def text(dt: datetime) -> str:
        return dt.strftime("%Y-%m-%d %H:%M:%S.%f")

    with sqlite3.connect(db) as conn:
        conn.executemany(
            "INSERT INTO pm_runs (schedule_key, name, slot_at, status, at, lateness_ms, error)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(k, n, text(s), st, text(a), lat, err) for k, n, s, st, a, lat, err in rows],
        )
        conn.execute(
            "INSERT INTO periodic_jobs (name, spec, timezone, task_type, payload, options)"
            " VALUES ('legacy.sql-import', '61 * * * *', 'UTC', 'legacy.job', 'null', '{}')"
        )


def shoot(d: Any, url: str, path: Path, size: tuple[int, int], *, before: Any = None) -> None:
    d.set_window_size(*size)
    d.get(url)
    for _ in range(300):
        if d.execute_script("return document.body.dataset.ready === '1'"):
            break
        time.sleep(0.02)
    if before is not None:
        before(d)
    height = d.execute_script("return document.documentElement.scrollHeight")
    # The window's height includes the browser's frame: leave room so the page is whole.
    d.set_window_size(size[0], min(max(height + 160, size[1]), 2600))
    time.sleep(0.2)
    d.save_screenshot(str(path))
    print(f"{path} ({path.stat().st_size // 1024} KiB)")


def type_spec(d: Any) -> None:
    field = d.find_element("css selector", "#f-spec")
    field.clear()
    field.send_keys("30 2 * 3 0")
    for _ in range(200):
        if d.find_elements("css selector", "#preview-slots li"):
            break
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    args = parser.parse_args()
    if (why := browser.missing()) is not None:
        sys.exit(why)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "pm.db"
        env = {"PM_SYNC_INTERVAL": "1", "PM_HEARTBEAT_INTERVAL": "1"}
        with browser.Server(f"sqlite:///{db}", "run", **env) as server:
            ids = {}
            with httpx.Client(base_url=server.base) as api:
                for body in SAMPLES:
                    r = api.post("/schedules", json=body)
                    r.raise_for_status()
                    ids[body["name"]] = r.json()["id"]
                sample_history(db, ids)
                api.post(f"/schedules/{ids['reports.daily']}/trigger").raise_for_status()
                for _ in range(100):  # the manager's next sync registers the rows (1 s)
                    if any(e["status"] == "error" for e in api.get("/entries").json()["items"]):
                        break
                    time.sleep(0.1)
            base = server.base
            with browser.chromium(*DESKTOP) as d:
                shoot(d, f"{base}/ui", out / "overview.png", DESKTOP)
                shoot(d, f"{base}/ui/schedules", out / "schedules.png", DESKTOP)
                shoot(
                    d,
                    f"{base}/ui/schedules/{ids['berlin.march-sundays']}",
                    out / "schedule.png",
                    DESKTOP,
                )
                shoot(d, f"{base}/ui/schedules/new", out / "form.png", DESKTOP, before=type_spec)
                shoot(d, f"{base}/ui/managers", out / "managers.png", DESKTOP)
                shoot(d, f"{base}/ui/schedules", out / "phone-schedules.png", PHONE)
                shoot(
                    d,
                    f"{base}/ui/schedules/{ids['reports.daily']}",
                    out / "phone-schedule.png",
                    PHONE,
                )


if __name__ == "__main__":
    main()
