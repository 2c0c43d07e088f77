"""``periodic-manager dead-letters list|replay|purge`` (a real process) on every backend."""

from __future__ import annotations

import json

from sqlalchemy import select

from periodic_manager.db.engine import create_engine
from periodic_manager.db.http_deliveries import DEAD, DONE, PENDING
from periodic_manager.db.models import http_deliveries_table as table
from tests.api.test_dead_letters import seed
from tests.cli.test_cli import run_cli


async def states(url: str) -> dict[str, tuple[str, int]]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                select(table.c.idempotency_key, table.c.state, table.c.attempts)
            )
            return {k: (s, a) for k, s, a in rows.all()}
    finally:
        await engine.dispose()


async def seeded(url: str) -> None:
    engine = create_engine(url)
    try:
        await seed(engine)
    finally:
        await engine.dispose()


async def test_list_replay_and_purge(db_url: str) -> None:
    env = {"PM_DATABASE_URL": db_url}
    await seeded(db_url)
    listed = run_cli("dead-letters", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 3 and "status 410" in lines[0] and "3 attempt(s)" in lines[0]
    as_json = [
        json.loads(x)
        for x in run_cli("dead-letters", "list", "--json", env=env).stdout.splitlines()
    ]
    assert [x["schedule"] for x in as_json] == ["a", "a", "b"]
    first = as_json[0]
    replayed = run_cli("dead-letters", "replay", str(first["id"]), env=env)
    assert replayed.returncode == 0 and "1 dead letter(s) replayed" in replayed.stdout
    assert (await states(db_url))[first["idempotency_key"]] == (PENDING, 0)
    again = run_cli("dead-letters", "replay", str(first["id"]), env=env)
    assert again.returncode == 3 and "named no dead letter" in again.stderr
    by_name = run_cli("dead-letters", "replay", "--schedule", "b", env=env)
    assert "1 dead letter(s) replayed" in by_name.stdout
    purged = run_cli("dead-letters", "purge", "--all", env=env)
    assert purged.returncode == 0 and "1 dead letter(s) purged" in purged.stdout
    assert sorted(s for s, _ in (await states(db_url)).values()) == [
        DONE,
        PENDING,
        PENDING,
        PENDING,
    ]
    assert DEAD not in {s for s, _ in (await states(db_url)).values()}


async def test_bad_arguments_are_one_line_and_status_2(sqlite_url: str) -> None:
    env = {"PM_DATABASE_URL": sqlite_url}
    bare = run_cli("dead-letters", "replay", env=env)
    assert bare.returncode == 2 and "--all" in bare.stderr and len(bare.stderr.splitlines()) == 1
    bad = run_cli("dead-letters", "purge", "0", env=env)
    assert bad.returncode == 2 and "ID:" in bad.stderr
    limit = run_cli("dead-letters", "list", "--limit", "0", env=env)
    assert limit.returncode == 2 and "--limit" in limit.stderr
