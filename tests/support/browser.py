"""A real headless Chromium (Debian's ``chromium`` and ``chromium-driver``) and a real server.

Used by ``test_ui_browser.py``, ``bench/ui_bench.py`` and ``docs/screenshots/make.py``. Selenium is
given the driver's path, so Selenium Manager never tries to download one; Chromium runs with a
fresh profile and without its background network traffic (the machine has no internet).
``PM_TEST_CHROMIUM`` and ``PM_TEST_CHROMEDRIVER`` point elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.support import ROOT
from tests.support.servers import free_port

CHROMIUM = os.environ.get("PM_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("PM_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


def missing() -> str | None:
    """Why no browser can run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{path} is not installed (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


@contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[Any]:
    """A WebDriver session on a fresh profile, quit (and the profile removed) at exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="pm-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(30)
        driver.set_script_timeout(30)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


class Server:
    """``periodic-manager <command>`` in a child process on a free loopback port."""

    def __init__(self, database_url: str, command: str = "run", **env: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.database_url = database_url
        self.command = command
        self.env = {
            **os.environ,
            "PM_DATABASE_URL": database_url,
            "PM_HOST": "127.0.0.1",
            "PM_PORT": str(self.port),
            "PM_TARGET": "outbox",
            "PM_LOG_LEVEL": "WARNING",
            **env,
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.log = tempfile.NamedTemporaryFile(prefix="pm-server-", suffix=".log", delete=False)

    def start(self, timeout_s: float = 30.0) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "periodic_manager", self.command],
            env=self.env,
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited: {self.output()}")
            try:
                if httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the server did not answer within {timeout_s} s: {self.output()}")

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


SPECS = (
    ("*/5 * * * *", "UTC"),
    ("0 * * * *", "UTC"),
    ("{minute} 2 * * *", "Europe/Berlin"),
    ("15 9 * * 1-5", "America/New_York"),
    ("@every 90s", "UTC"),
    ("0 6 1 * *", "Asia/Kolkata"),
)


def schedule_rows(
    count: int, prefix: str = "bulk"
) -> list[tuple[str, str, str, str, str, str, bool]]:
    """``count`` schedules as (name, spec, zone, task type, payload, options, enabled).

    Row ``i``: spec and zone cycle through :data:`SPECS`, task type ``task.<i % 4>``, queue
    ``q<i % 3>``, and every 10th row is paused.
    """
    rows = []
    for i in range(count):
        spec, zone = SPECS[i % len(SPECS)]
        rows.append(
            (
                f"{prefix}.{i:05d}",
                spec.format(minute=i % 60),
                zone,
                f"task.{i % 4}",
                json.dumps({"n": i}),
                json.dumps({"queue": f"q{i % 3}"}),
                i % 10 != 9,
            )
        )
    return rows


def seed_sqlite(path: Path, count: int, *, prefix: str = "bulk") -> None:
    """:func:`schedule_rows` written straight into a migrated SQLite file (as an import would)."""
    import sqlite3

    created = "2026-01-01 00:00:00.000000"
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO periodic_jobs (name, spec, timezone, task_type, payload, options, enabled,"
            " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(*row, created, created) for row in schedule_rows(count, prefix)],
        )
