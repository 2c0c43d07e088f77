"""The dashboard's dead-letters page in a real headless Chromium against ``periodic-manager api``:
a dead letter is listed with its key and last answer, and *Replay* makes it pending again (the
API's answer shown). Skips without Chromium locally, fails under CI=true (as the other UI tests)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from periodic_manager.db.migrate import upgrade_sync
from tests.api.test_ui_browser import driver, open_page, text_of, wait_text  # noqa: F401
from tests.support import browser

KEY = "hooks.daily:2026-03-01T06:00:00Z"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path: Path = tmp_path_factory.mktemp("ui-dead") / "pm.db"
    upgrade_sync(f"sqlite:///{path}")
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(
            "INSERT INTO pm_http_deliveries (idempotency_key, name, slot_at, host, request, body,"
            " state, attempts, created_at, next_attempt_at, last_status, last_error, last_body,"
            " finished_at) VALUES (?, 'hooks.daily', '2026-03-01 06:00:00.000000', 'h:443',"
            " '{\"url\":\"https://hooks.example.com/in\"}', '{}', 'dead', 1,"
            " '2026-03-01 06:00:00.000000', '2026-03-01 06:00:00.000000', 410,"
            " 'HTTP 410: a permanent answer', 'gone for good', '2026-03-01 06:00:01.000000')",
            (KEY,),
        )
        conn.commit()
    return path


@pytest.fixture(scope="module")
def server(db: Path) -> Iterator[browser.Server]:
    with browser.Server(f"sqlite:///{db}", "api") as s:
        yield s


def test_a_dead_letter_is_shown_and_replayed(driver: Any, server: browser.Server, db: Path) -> None:  # noqa: F811
    d = driver
    open_page(d, f"{server.base}/ui/dead-letters")
    row = wait_text(d, "#dead-letters tbody", KEY)
    assert "410" in row and "gone for good" in row and "hooks.example.com" in row
    d.find_element("css selector", "button[data-letter]").click()
    wait_text(d, "#answer", "POST /dead-letters/1/replay → 200")
    assert "1 replayed" in text_of(d, "#answer")
    wait_text(d, "#dead-letters", "No dead letter.")
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT state, attempts FROM pm_http_deliveries").fetchall() == [
            ("pending", 0)
        ]
