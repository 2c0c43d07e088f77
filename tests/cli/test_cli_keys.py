"""``periodic-manager keys create|list|revoke`` as a user runs it (real processes, real
databases), a CLI-made key used against the API, and ``api`` beyond loopback starting only once
an active admin key exists."""

from __future__ import annotations

import asyncio
import hashlib
import re
import signal
import subprocess

import httpx
import pytest
from sqlalchemy import select

from periodic_manager.access import split_key
from periodic_manager.api import create_app
from periodic_manager.clock import VirtualClock
from periodic_manager.db.engine import create_engine
from periodic_manager.db.models import api_keys_table
from periodic_manager.settings import Settings
from tests.cli.test_cli import CLI, run_cli
from tests.runtime.test_startup import clean_env
from tests.support.api import T0

KEY_LINE = re.compile(r"^pmk_[0-9a-f]{12}_[A-Za-z0-9_-]{43}$")


def one_line_error(proc: subprocess.CompletedProcess[str], status: int, *fragments: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == status and len(lines) == 1, (proc.returncode, proc.stderr)
    assert lines[0].startswith("periodic-manager: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


async def test_create_list_revoke_on_each_backend(db_url: str) -> None:
    env = {"PM_DATABASE_URL": db_url}
    made = run_cli("keys", "create", "--name", "ci-deployer", "--scope", "write", env=env)
    assert made.returncode == 0, made.stderr
    lines = made.stdout.strip().splitlines()
    assert len(lines) >= 2 and KEY_LINE.match(lines[-1]), made.stdout  # alone on the last line
    assert not any(KEY_LINE.search(line) for line in lines[:-1])
    key = lines[-1]
    parts = split_key(key)
    assert parts is not None

    engine = create_engine(db_url)
    try:
        async with engine.connect() as conn:
            row = (await conn.execute(select(api_keys_table))).one()._mapping
        assert row["name"] == "ci-deployer" and row["scope"] == "write"
        assert row["secret_sha256"] == hashlib.sha256(parts[1].encode()).hexdigest()
        assert not any(parts[1] in str(v) for v in row.values())
    finally:
        await engine.dispose()

    listed = run_cli("keys", "list", env=env)
    assert listed.returncode == 0 and parts[1] not in listed.stdout
    assert re.search(r"^ci-deployer\s+write\s+active\s", listed.stdout, re.M), listed.stdout

    dup = run_cli("keys", "create", "--name", "ci-deployer", "--scope", "read", env=env)
    one_line_error(dup, 2, "--name", "exists already")
    assert run_cli("keys", "revoke", "ci-deployer", env=env).returncode == 0
    listed = run_cli("keys", "list", env=env)
    assert re.search(r"^ci-deployer\s+write\s+revoked\s", listed.stdout, re.M), listed.stdout
    one_line_error(run_cli("keys", "revoke", "nope", env=env), 2, "NAME", "no key named 'nope'")


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--name", "ok", "--scope", "root"], "--scope"),
        (["--name", "bad name", "--scope", "read"], "--name"),
        (
            ["--name", "ok", "--scope", "read", "--expires-at", "2000-01-01T00:00:00Z"],
            "--expires-at",
        ),
        (["--name", "ok", "--scope", "read", "--expires-at", "soon"], "--expires-at"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_the_database(args: list[str], names: str) -> None:
    env = {"PM_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/unreachable"}
    one_line_error(run_cli("keys", "create", *args, env=env), 2, names)


def test_an_unreachable_database_is_one_line_and_exit_1() -> None:
    env = {"PM_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/unreachable"}
    one_line_error(run_cli("keys", "list", env=env), 1, "database")


async def test_a_key_made_by_the_cli_works_until_the_cli_revokes_it(migrated_pg_url: str) -> None:
    env = {"PM_DATABASE_URL": migrated_pg_url}
    made = run_cli("keys", "create", "--name", "ops", "--scope", "trigger", env=env)
    key = made.stdout.strip().splitlines()[-1]
    engine = create_engine(migrated_pg_url)
    app = create_app(Settings(database_url=migrated_pg_url), clock=VirtualClock(T0), engine=engine)
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
                auth = {"Authorization": f"Bearer {key}"}
                assert (await c.get("/schedules")).status_code == 401
                who = (await c.get("/views/whoami", headers=auth)).json()
                assert who["scope"] == "trigger" and who["key"] == "ops"
                assert (await c.post("/schedules/999999/pause", headers=auth)).status_code == 404
                assert (await c.delete("/schedules/999999", headers=auth)).status_code == 403
                assert run_cli("keys", "revoke", "ops", env=env).returncode == 0
                assert (await c.get("/schedules", headers=auth)).status_code == 401
    finally:
        await engine.dispose()


async def test_api_beyond_loopback_starts_once_an_active_admin_key_exists(
    migrated_pg_url: str,
) -> None:
    env = clean_env(PM_DATABASE_URL=migrated_pg_url)
    args = ("api", "--host", "0.0.0.0", "--port", "0")
    refused = run_cli(*args, env=env)
    one_line_error(refused, 1, "PM_HOST", "periodic-manager keys create", "--scope admin")
    assert run_cli("keys", "create", "--name", "reader", "--scope", "read", env=env).returncode == 0
    one_line_error(run_cli(*args, env=env), 1, "no active admin key")  # read keys do not count
    assert run_cli("keys", "create", "--name", "root", "--scope", "admin", env=env).returncode == 0
    proc = await asyncio.create_subprocess_exec(
        *CLI, *args, env=env, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stderr is not None
    try:
        port = None
        async with asyncio.timeout(30):
            while port is None:
                line = (await proc.stderr.readline()).decode()
                assert line, "api exited"
                found = re.search(r"API on http://0\.0\.0\.0:(\d+)", line)
                port = int(found.group(1)) if found else None
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            assert (await client.get("/schedules")).status_code == 401  # keys turn auth on
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        rest = (await asyncio.wait_for(proc.stderr.read(), 30)).decode()
        await asyncio.wait_for(proc.wait(), 30)
    assert "Application startup complete" in rest and "no active admin key" not in rest, rest
    assert run_cli("keys", "revoke", "root", env=env).returncode == 0
    one_line_error(run_cli(*args, env=env), 1, "no active admin key")
