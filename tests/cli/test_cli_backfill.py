"""``periodic-manager backfill NAME --from --to [--dry-run] [--force]`` on PostgreSQL, SQLite and
MariaDB (a real process, the outbox target): counts, a dry run sends nothing, a second run sends
nothing, every slot reaches the outbox with its nominal scheduled_at and key; slots older than
what is remembered are sent only with --force (exit 3 and a note without); bad input is one line
naming the flag, exit 2."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.cli.test_cli import run_cli
from tests.support import rawsql

RANGE = ["--from", "2024-05-01T12:00:00Z", "--to", "2024-05-01T12:05:00+00:00"]


def env(url: str) -> dict[str, str]:
    # A high rate: the process runs on the wall clock, and pacing is tested on a virtual one.
    return {"PM_DATABASE_URL": url, "PM_TARGET": "outbox", "PM_CATCHUP_RATE": "100000"}


async def outbox(url: str) -> list[tuple[str, str]]:
    rows = await rawsql.execute(
        url, "SELECT scheduled_at, idempotency_key FROM pm_outbox ORDER BY seq"
    )
    out = []
    for at, key in rows:
        at = at if isinstance(at, datetime) else datetime.fromisoformat(at)
        out.append((at.replace(tzinfo=at.tzinfo or UTC).astimezone(UTC).strftime("%H:%M"), key))
    return out


async def test_backfill_sends_the_range_once_and_a_dry_run_sends_nothing(db_url: str) -> None:
    await rawsql.insert(db_url, "cli.bf")
    dry = run_cli("backfill", "cli.bf", *RANGE, "--dry-run", env=env(db_url))
    assert dry.returncode == 0, dry.stderr
    assert "5 slot(s) in the range, 0 already sent, 5 would be sent" in dry.stdout
    assert await outbox(db_url) == []
    done = run_cli("backfill", "cli.bf", *RANGE, env=env(db_url))
    assert done.returncode == 0, done.stderr
    assert "5 slot(s) in the range: 5 sent, 0 already sent" in done.stdout
    assert await outbox(db_url) == [
        (f"12:0{m}", f"cli.bf:2024-05-01T12:0{m}:00Z") for m in range(5)
    ]
    again = run_cli("backfill", "cli.bf", *RANGE, env=env(db_url))
    assert again.returncode == 0, again.stderr
    assert "0 sent, 5 already sent" in again.stdout
    assert len(await outbox(db_url)) == 5


async def test_slots_older_than_what_is_remembered_are_sent_only_with_force(db_url: str) -> None:
    # A row created long before the retention (7 days): what was sent of it then is forgotten.
    await rawsql.insert(db_url, "cli.old", created_at=rawsql.instant(db_url, "2024-01-01 00:00:00"))
    r = run_cli("backfill", "cli.old", *RANGE, env=env(db_url))
    assert r.returncode == 3, r.stderr
    assert "5 slot(s) in the range: 0 sent, 0 already sent" in r.stdout
    [line] = [x for x in r.stderr.splitlines() if x.startswith("periodic-manager: note:")]
    assert "5 slot(s) older than what is remembered" in line and "--force sends them" in line, line
    assert await outbox(db_url) == []
    forced = run_cli("backfill", "cli.old", *RANGE, "--force", env=env(db_url))
    assert forced.returncode == 0, forced.stderr
    assert "5 sent" in forced.stdout and "were sent (--force)" in forced.stderr
    assert len(await outbox(db_url)) == 5
    again = run_cli("backfill", "cli.old", *RANGE, env=env(db_url))  # recorded now: known sent
    assert again.returncode == 0 and "0 sent, 5 already sent" in again.stdout, (
        again.stdout + again.stderr
    )


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (
            ["--from", "2024-05-01T12:00:00Z", "--to", "2024-05-01T11:00:00Z"],
            "--to: must be after from",
        ),
        (["--from", "noon", "--to", "2024-05-01T11:00:00Z"], "--from: "),
        (
            ["--from", "2024-05-01T12:00:00Z", "--to", "2999-01-01T00:00:00Z"],
            "--to: must not be after now",
        ),
        (
            ["--from", "2000-01-01T00:00:00Z", "--to", "2024-05-01T11:00:00Z"],
            "--to: the range holds more than",
        ),
    ],
)
async def test_bad_input_is_one_line_naming_the_flag(
    db_url: str, args: list[str], flag: str
) -> None:
    await rawsql.insert(db_url, "cli.bad")
    r = run_cli("backfill", "cli.bad", *args, env=env(db_url))
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"periodic-manager: error: {flag}"), line


async def test_an_unknown_or_paused_schedule_is_refused(db_url: str) -> None:
    r = run_cli("backfill", "nobody", *RANGE, env=env(db_url))
    assert r.returncode == 2 and "no schedule named 'nobody'" in r.stderr
    await rawsql.insert(db_url, "cli.paused", enabled="false")
    r = run_cli("backfill", "cli.paused", *RANGE, env=env(db_url))
    assert r.returncode == 2 and "paused" in r.stderr, r.stderr


@pytest.mark.parametrize("rate", ["0", "-5", "100001", "fast", "nan"])
def test_a_bad_catchup_rate_is_one_line_naming_it(rate: str) -> None:
    r = run_cli("backfill", "x", *RANGE, env={"PM_CATCHUP_RATE": rate})
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert "PM_CATCHUP_RATE" in line, line
