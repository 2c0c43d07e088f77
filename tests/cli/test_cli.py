"""The ``periodic-manager`` command as a user runs it: real processes, real services.

These wait on observable state (an HTTP answer, a row) with bounded polls; none waits for a slot.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from periodic_manager.api.app import create_app
from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import upgrade
from periodic_manager.settings import Settings
from tests.support.servers import free_port

CLI = [sys.executable, "-m", "periodic_manager"]


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PM_")}
    full_env.update(env or {})
    return subprocess.run(
        CLI + list(args), capture_output=True, text=True, env=full_env, cwd=cwd, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["migrate"], {"PM_SYNC_INTERVAL": "soon"}, "PM_SYNC_INTERVAL"),
        (["manager", "--grace", "-1"], {}, "--grace"),
        (["run", "--target", "kafka"], {}, "PM_TARGET"),
        (["api"], {"PM_DATABASE_URL": "oracle://u@h/db"}, "PM_DATABASE_URL"),
        (
            ["manager"],
            {"PM_DATABASE_URL": "mysql://u@h/db", "PM_COORDINATION": "partitions"},
            "PM_COORDINATION",
        ),
        (["run", "--port", "70000"], {}, "--port"),
        (["migrate", "--log-level", "LOUD"], {}, "PM_LOG_LEVEL"),
        (["manager"], {"PM_RUNS_RETENTION": "1e12"}, "PM_RUNS_RETENTION"),
    ],
)
def test_bad_setting_is_one_line_and_exit_2(
    args: list[str], env: dict[str, str], names: str
) -> None:
    proc = run_cli(*args, env=env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and lines[0].startswith("periodic-manager: error:")


@pytest.mark.parametrize(
    "setting", ["PM_DATABASE_URL", "PM_REDIS_URL", "PM_CELERY_BROKER_URL", "PM_DRAMATIQ_URL"]
)
def test_a_rejected_url_is_echoed_without_its_password(setting: str, tmp_path: Path) -> None:
    env = {"PM_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/pm.db"}
    assert run_cli("migrate", env=env).returncode == 0
    env[setting] = "oracle://admin:hunter2@db.example:1521/prod"
    env["PM_TARGET"] = (
        "dramatiq" if "DRAMATIQ" in setting else "celery" if "CELERY" in setting else "redis"
    )
    proc = run_cli("manager", env=env)
    assert proc.returncode in (1, 2)  # 2: refused by the settings, 1: by the target at start
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("periodic-manager: error: ") and f"{setting}: " in line, line
    assert "hunter2" not in line, line


def test_a_mysql_url_without_asyncmy_names_the_extra_in_one_line() -> None:
    hide = "import sys; sys.modules['asyncmy'] = None; from periodic_manager.cli.main import main; sys.exit(main())"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PM_")}
    proc = subprocess.run(
        [sys.executable, "-c", hide, "api", "--database-url", "mariadb://u@h/db"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert "PM_DATABASE_URL" in line and "pip install 'periodic-manager[mysql]'" in line, line


def test_migrate_upgrades_a_fresh_mariadb_database(mariadb_url: str) -> None:
    url = mariadb_url.replace("mysql+asyncmy://", "mysql://").split("?")[0]  # as a user writes it
    proc = run_cli("migrate", "--database-url", url)
    assert proc.returncode == 0, proc.stderr
    assert "0013_max_runs" in proc.stderr + proc.stdout

    async def tables() -> set[str]:
        engine = create_engine(url)
        async with engine.connect() as conn:
            names = set((await conn.execute(text("SHOW TABLES"))).scalars())
        await engine.dispose()
        return names

    assert {"periodic_jobs", "pm_outbox", "pm_revision", "alembic_version"} <= asyncio.run(tables())


def test_migrate_upgrades_a_fresh_postgresql_database(pg_url: str) -> None:
    proc = run_cli("migrate", "--database-url", pg_url)
    assert proc.returncode == 0, proc.stderr

    async def tables() -> set[str]:
        engine = create_engine(pg_url)
        async with engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            )
            names = {r[0] for r in rows}
        await engine.dispose()
        return names

    assert {
        "periodic_jobs",
        "pm_outbox",
        "pm_entries",
        "pm_managers",
        "alembic_version",
    } <= asyncio.run(tables())


async def poll(check: Callable[[], Awaitable[bool]], seconds: float = 20.0) -> None:
    """Wait (bounded) for an observable condition of another process."""
    for _ in range(int(seconds / 0.1)):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("condition not reached in time")


async def test_run_embedded_defaults_serves_api_and_manager(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PM_")}
    env["PM_PORT"] = str(port)
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        "run",
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:

            async def healthy() -> bool:
                try:
                    return (await client.get("/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await poll(healthy)
            resp = await client.post(
                "/schedules", json={"name": "cli.demo", "spec": "@every 1h", "task_type": "demo"}
            )
            assert resp.status_code == 201, resp.text

            async def registered() -> bool:
                items = (await client.get("/entries")).json()["items"]
                return [e["name"] for e in items] == ["cli.demo"]

            await poll(registered)  # the in-process manager is told of the edit at once
        assert (tmp_path / "periodic_manager.db").exists()  # the embedded default database
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    # Graceful: the manager stopped and unpublished itself. Uvicorn re-raises the SIGTERM it
    # handled once shutdown is complete, so the status is that of the signal, as supervisors expect.
    assert "stopped" in err.decode(), err.decode()[-2000:]
    assert proc.returncode in (0, -signal.SIGTERM), err.decode()[-2000:]


@pytest.fixture
async def api_client(pg_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    await upgrade(pg_url)
    settings = Settings(database_url=pg_url, heartbeat_interval=0.2)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            yield client, pg_url


async def test_manager_in_another_process_is_visible_and_disappears_when_killed(
    api_client: tuple[httpx.AsyncClient, str],
) -> None:
    client, url = api_client
    resp = await client.post(
        "/schedules", json={"name": "remote", "spec": "0 6 * * *", "task_type": "t"}
    )
    assert resp.status_code == 201
    env = {k: v for k, v in os.environ.items() if not k.startswith("PM_")}
    env.update(
        PM_DATABASE_URL=url, PM_SYNC_INTERVAL="0.2", PM_HEARTBEAT_INTERVAL="0.2", PM_TARGET="outbox"
    )
    proc = await asyncio.create_subprocess_exec(
        *CLI, "manager", env=env, stderr=asyncio.subprocess.PIPE
    )
    try:

        async def names() -> list[str]:
            return [e["name"] for e in (await client.get("/entries")).json()["items"]]

        async def visible() -> bool:
            return await names() == ["remote"]

        await poll(visible)
        # An edit through the API (no in-process manager here) reaches it by its sync loop.
        resp = await client.post(
            "/schedules", json={"name": "second", "spec": "0 7 * * *", "task_type": "t"}
        )
        assert resp.status_code == 201

        async def both() -> bool:
            return sorted(await names()) == ["remote", "second"]

        await poll(both)
        proc.kill()
        await proc.wait()

        async def gone() -> bool:
            return await names() == []

        await poll(gone, seconds=5)  # three heartbeats are 0.6 s
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_settings_read_pm_variables_in_any_case_and_arguments_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic import ValidationError

    monkeypatch.setenv("pm_sync_interval", "7.5")
    monkeypatch.setenv("PM_GRACE", "12")
    monkeypatch.setenv("PM_NOT_A_SETTING", "ignored")
    monkeypatch.setenv("XPM_HEARTBEAT_INTERVAL", "99")
    settings = Settings(grace=3)
    assert (settings.sync_interval, settings.grace, settings.heartbeat_interval) == (7.5, 3, 5.0)
    monkeypatch.setenv("PM_GRACE", "-1")
    with pytest.raises(ValidationError, match="grace"):
        Settings()
