"""What an operator meets on day one, with real processes: a database that cannot be used ends
every command with one line and a non-zero exit; ``migrate`` is safe to run twice at once and
says what it applied; ``run`` binds its port before it leads.

Processes run concurrently where they are independent (the machine has two cores); every wait
is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from periodic_manager.db.migrate import head_revision, pending, upgrade
from periodic_manager.runtime import startup
from tests.conftest import PG_DSN, REDIS_URL, _unavailable
from tests.support.servers import PostgresServer

CLI = [sys.executable, "-m", "periodic_manager"]
SERVING = ("run", "api")
EVERY_COMMAND = ("migrate", "manager", "run", "api")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PM_")}
    env.update(extra)
    return env


async def cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        *args,
        env=env or clean_env(),
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(
            f"periodic-manager {' '.join(args)} did not exit within 60 s"
        ) from None
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def port_args(command: str) -> list[str]:
    return ["--port", "0"] if command in SERVING else []


def assert_one_line_failure(rc: int, err: str, *fragments: str) -> str:
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1, (rc, err[-3000:])
    assert lines[0].startswith("periodic-manager: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture
async def admin() -> AsyncIterator[asyncpg.Connection]:
    try:
        conn = await asyncpg.connect(f"{PG_DSN}/postgres", timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        _unavailable("PostgreSQL", exc)
    try:
        yield conn
    finally:
        await conn.close()


async def test_never_migrated_database_stops_every_long_running_command_naming_migrate(
    pg_url: str, tmp_path: Path
) -> None:
    runs = [
        cli(command, "--database-url", pg_url, *port_args(command))
        for command in ("manager", *SERVING)
    ]
    missing_file = f"sqlite:///{tmp_path}/never.db"
    runs += [
        cli(command, "--database-url", missing_file, *port_args(command))
        for command in ("manager", "api")
    ]
    results = await asyncio.gather(*runs)
    for rc, _, err in results[:3]:
        assert_one_line_failure(
            rc, err, "the database was never migrated", "run `periodic-manager migrate`"
        )
    for rc, _, err in results[3:]:
        assert_one_line_failure(rc, err, "the file does not exist", "periodic-manager migrate")
    assert not (tmp_path / "never.db").exists()  # checking did not create an empty database


async def test_schema_behind_head_names_the_missing_migrations(pg_url: str) -> None:
    shipped = pending(None)
    await upgrade(pg_url, shipped[-2])
    rc, _, err = await cli("manager", "--database-url", pg_url)
    assert_one_line_failure(
        rc, err, f"behind head {head_revision()}", shipped[-1], "periodic-manager migrate"
    )


async def test_unusable_database_is_one_line_and_exit_1_for_every_command() -> None:
    """Wrong password (a private server that checks it), missing database, nothing listening:
    one line naming the database with its password hidden, for migrate, manager, run and api
    (every command with the wrong password; two commands each for the other causes, to keep
    the number of processes down)."""
    server = PostgresServer(password="right-password")
    try:
        server.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        server.close()
        _unavailable("a private PostgreSQL (initdb, pg_ctl)", exc)
    try:
        # The refused port stays bound (not listening) until the end: nothing else can take it.
        refused = socket.socket()
        refused.bind(("127.0.0.1", 0))
        cases = [
            (
                'password authentication failed for user "postgres"',
                server.url(password="hidden-secret"),
                EVERY_COMMAND,
            ),
            (
                "does not exist",
                f"{PG_DSN}/pm_test_missing_{uuid.uuid4().hex[:8]}",
                ("migrate", "run"),
            ),
            (
                "connection refused",
                f"postgresql://postgres:hidden-secret@127.0.0.1:{refused.getsockname()[1]}/x",
                ("manager", "api"),
            ),
        ]
        runs = [
            (cause, url, command, cli(command, "--database-url", url, *port_args(command)))
            for cause, url, commands in cases
            for command in commands
        ]
        results = await asyncio.gather(*(run for *_, run in runs))
    finally:
        server.close()
        refused.close()
    for (cause, url, command, _), (rc, _, err) in zip(runs, results, strict=True):
        line = assert_one_line_failure(rc, err, cause)
        assert "hidden-secret" not in err, (command, line)
        shown = url.replace("hidden-secret", "***")
        assert f"database {shown}:" in line, (command, line)


async def test_a_server_that_never_answers_is_named_as_such(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A port that accepts and never speaks: the check gives up after its bound and says so
    (not the name of the CancelledError behind the timeout)."""
    monkeypatch.setattr(startup, "CONNECT_TIMEOUT_S", 1.0)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"postgresql://postgres:hidden-secret@127.0.0.1:{silent.getsockname()[1]}/x"
        with pytest.raises(startup.StartupError) as caught:
            await startup.check_database(url)
    assert (
        str(caught.value) == f"database {url.replace('hidden-secret', '***')}: no answer within 1 s"
    )


async def test_a_manager_whose_broker_does_not_answer_exits_1_naming_the_target(
    pg_url: str, redis_prefix: str
) -> None:
    """A wrong PM_REDIS_URL (a closed port): ``manager`` and ``run`` end at start with one line
    naming the target, where it sends (password hidden) and the cause, as for the database;
    with several targets, each one that does not answer is named, and only those."""
    await upgrade(pg_url)
    with socket.socket() as refused:  # bound, never listening: nothing else can take the port
        refused.bind(("127.0.0.1", 0))
        port = refused.getsockname()[1]
        url = f"redis://:hidden-secret@127.0.0.1:{port}/0"
        env = clean_env(PM_DATABASE_URL=pg_url, PM_REDIS_URL=url, PM_TARGET="redis")
        routed = clean_env(
            PM_DATABASE_URL=pg_url,
            PM_REDIS_URL=REDIS_URL,
            PM_ARQ_REDIS_URL=url,
            PM_TARGET="redis",
            PM_TARGETS="arq,outbox",
            PM_STREAM_PREFIX=redis_prefix,
        )
        started = asyncio.get_running_loop().time()
        results = await asyncio.gather(
            cli("manager", env=env), cli("run", "--port", "0", env=env), cli("manager", env=routed)
        )
        took = asyncio.get_running_loop().time() - started
    shown = f"redis://:***@127.0.0.1:{port}/0"
    for rc, _, err in results[:2]:
        assert_one_line_failure(
            rc, err, f"target redis ({shown}, no consumer group): connection refused"
        )
        assert "hidden-secret" not in err
    line = assert_one_line_failure(
        results[2][0], results[2][2], f"target arq ({shown}): connection refused"
    )
    assert "target redis" not in line and "outbox" not in line
    assert took < startup.CONNECT_TIMEOUT_S + 20  # three processes' imports on two cores included


async def test_a_broker_that_never_answers_is_named_within_the_start_up_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from periodic_manager.settings import Settings
    from periodic_manager.targets.redis.streams import RedisStreamsTarget

    monkeypatch.setattr(startup, "CONNECT_TIMEOUT_S", 1.0)
    with socket.socket() as silent:  # accepts, never speaks
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        settings = Settings(target="redis", redis_url=url)
        target = RedisStreamsTarget.from_url(url, timeout=30)
        try:
            with pytest.raises(startup.StartupError) as caught:
                async with asyncio.timeout(5):
                    await startup.check_targets(settings, target)
        finally:
            await target.close()
    assert str(caught.value) == f"target redis ({url}, no consumer group): no answer within 1 s"


async def test_two_migrate_at_once_on_an_empty_database_both_succeed(
    admin: asyncpg.Connection,
) -> None:
    """The advisory lock serialises them: one applies every migration, the other finds the
    schema at head and applies nothing. Five rounds, each on a new database."""
    shipped = pending(None)
    for _ in range(5):
        name = f"pm_test_{uuid.uuid4().hex[:12]}"
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            url = f"{PG_DSN}/{name}"
            (rc1, _, err1), (rc2, _, err2) = await asyncio.gather(
                cli("migrate", "--database-url", url), cli("migrate", "--database-url", url)
            )
            assert rc1 == 0 and rc2 == 0, (err1[-3000:], err2[-3000:])
            applied = sorted(len(re.findall(r" applied (\S+) \(", err)) for err in (err1, err2))
            assert applied == [0, len(shipped)], (err1, err2)
            assert any("schema already at head" in err for err in (err1, err2))
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_migrate_says_what_it_applied(pg_url: str) -> None:
    shipped = pending(None)
    await upgrade(pg_url, shipped[0])
    rc, _, err = await cli("migrate", "--database-url", pg_url)
    assert rc == 0, err
    assert re.findall(r" applied (\S+) \(", err) == shipped[1:]
    assert f"schema at head {head_revision()} ({len(shipped) - 1} applied)" in err
    rc, _, err = await cli("migrate", "--database-url", pg_url)
    assert rc == 0 and f"schema already at head {head_revision()}, nothing to apply" in err


async def test_run_with_its_port_taken_exits_before_it_migrates_or_leads(
    tmp_path: Path, pg_url: str
) -> None:
    await upgrade(pg_url)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        (rc_lite, _, err_lite), (rc_pg, _, err_pg) = await asyncio.gather(
            cli("run", "--port", port, cwd=tmp_path),  # embedded default: SQLite in cwd
            cli("run", "--port", port, "--database-url", pg_url),
        )
    for rc, err in ((rc_lite, err_lite), (rc_pg, err_pg)):
        # One line and nothing else: no migration ran, no manager started or led.
        assert_one_line_failure(rc, err, f"cannot listen on 127.0.0.1:{port}", "in use")
    assert not (tmp_path / "periodic_manager.db").exists()


async def test_run_and_api_beyond_loopback_without_a_token_refuse_to_start(
    tmp_path: Path,
) -> None:
    """Bound beyond loopback with no token, the API would let anyone edit schedules: run and
    api refuse before anything else (nothing migrated, nothing bound), saying how to fix it.
    With PM_API_READ_TOKEN alone nobody can write, so that one starts as far as its database."""
    for command in ("run", "api"):
        rc, _, err = await cli(command, "--host", "0.0.0.0", "--port", "0", cwd=tmp_path)
        assert_one_line_failure(rc, err, "PM_HOST", "0.0.0.0", "PM_API_TOKEN", "127.0.0.1")
    assert not (tmp_path / "periodic_manager.db").exists()
    env = clean_env(PM_API_READ_TOKEN="read-only-token", PM_DATABASE_URL=f"{PG_DSN}/pm_missing_x")
    rc, _, err = await cli("api", "--host", "0.0.0.0", "--port", "0", env=env)
    assert_one_line_failure(rc, err, "does not exist")


async def test_run_logs_database_target_and_schema_then_is_ready(pg_url: str) -> None:
    await upgrade(pg_url)
    with_password = pg_url.replace("postgres@", "postgres:s3cret-pw@")
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        "run",
        "--database-url",
        with_password,
        "--port",
        "0",
        "--target",
        "outbox",
        env=clean_env(PM_LEADER_ELECTION="false"),
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        port = None
        async with asyncio.timeout(30):
            while port is None:
                line = (await proc.stderr.readline()).decode()
                assert line, "run exited: " + "".join(lines)
                lines.append(line)
                found = re.search(r"API on http://127\.0\.0\.1:(\d+)", line)
                port = int(found.group(1)) if found else None
        start_line = lines[-1]
        shown = with_password.replace("s3cret-pw", "***")
        assert f"database {shown} (schema {head_revision()})" in start_line, start_line
        assert "target outbox (table pm_outbox)" in start_line and "s3cret-pw" not in start_line
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            r = await client.get("/readyz")
        assert r.status_code == 200, r.text
        assert r.json()["checks"] == {
            "database": "ok",
            "schema": "ok",
            "target": "ok",
            "manager": "leader",
            "clock": "ok",
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        rest = await asyncio.wait_for(proc.stderr.read(), 30)
        await proc.wait()
    assert "s3cret-pw" not in "".join(lines) + rest.decode()


def test_the_start_up_line_names_the_redis_consumer_group_and_hides_passwords() -> None:
    from periodic_manager.runtime.startup import describe_targets
    from periodic_manager.settings import Settings

    with_group = Settings(
        target="redis", redis_url="redis://:pw@127.0.0.1:6379/0", redis_group="workers"
    )
    assert (
        describe_targets(with_group)
        == "redis (redis://:***@127.0.0.1:6379/0, consumer group workers)"
    )
    without = Settings(target="redis", redis_url="redis://127.0.0.1:6379/0")
    assert describe_targets(without) == "redis (redis://127.0.0.1:6379/0, no consumer group)"
    celery = Settings(
        target="celery",
        celery_broker_url="redis://127.0.0.1:6379/1",
        celery_result_backend="redis://:pw@127.0.0.1:6379/2",
    )
    assert describe_targets(celery) == (
        "celery (redis://127.0.0.1:6379/1, results redis://:***@127.0.0.1:6379/2)"
    )


# What a manager-only process never loads: the API with its web stack and dashboard, Alembic (the
# schema is compared with HEAD_REVISION), every target it does not send to, the file formats of
# import/export, what only a calendar of holidays, a description or a scrape needs
# (prometheus_client: the metrics count in plain dicts until a registry is asked for) and the
# dialects of the databases it does not talk to.
NOT_IN_A_MANAGER = (
    "fastapi",
    "starlette",
    "uvicorn",
    "jinja2",
    "alembic",
    "mako",
    "dramatiq",
    "celery",
    "kombu",
    "arq",
    "rq",
    "procrastinate",
    "aiosqlite",
    "asyncmy",
    "httpx",
    "yaml",
    "tomli_w",
    "holidays",
    "cron_descriptor",
    "prometheus_client",
)
NOT_IN_A_MANAGER_OF_OURS = (
    "periodic_manager.api",
    "periodic_manager.migrations.",
    "periodic_manager.targets.dramatiq",
    "periodic_manager.targets.celery",
    "periodic_manager.targets.arq",
    "periodic_manager.targets.rq",
    "periodic_manager.targets.procrastinate",
    "periodic_manager.targets.outbox",
    "periodic_manager.cli.files",
    "periodic_manager.schedules.import_export",
)
NOT_IN_A_MANAGER_ON_POSTGRESQL = ("sqlalchemy.dialects.mysql",)
# The real `manager` command, stopped once started: what it imported to get there.
MODULES_OF_A_STARTED_MANAGER = """
import json, sys
from periodic_manager.cli import main

async def started(manager, probe):
    await manager.start()
    try:
        print(json.dumps(sorted(sys.modules)), flush=True)
    finally:
        await manager.stop()
    return 0

main._supervise = started
sys.exit(main.main(["manager"]))
"""


async def test_a_manager_loads_neither_the_api_nor_alembic_nor_a_target_it_does_not_use(
    pg_url: str, redis_prefix: str
) -> None:
    await upgrade(pg_url)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        MODULES_OF_A_STARTED_MANAGER,
        env=clean_env(
            PM_DATABASE_URL=pg_url,
            PM_REDIS_URL=REDIS_URL,
            PM_TARGET="redis",
            PM_STREAM_PREFIX=redis_prefix,
        ),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-3000:]
    loaded = set(json.loads(out))
    assert "periodic_manager.targets.redis.streams" in loaded  # it did start a manager
    assert "started with 0 entries" in err.decode()
    unwanted = sorted(
        name
        for name in loaded
        if name.partition(".")[0] in NOT_IN_A_MANAGER
        or name.startswith((*NOT_IN_A_MANAGER_OF_OURS, *NOT_IN_A_MANAGER_ON_POSTGRESQL))
    )
    assert unwanted == []
