"""Liveness and readiness: the probe file of a real manager process goes stale when its event
loop cannot run (SIGSTOP) and fresh again after SIGCONT; ``health`` exits 1 / 0 accordingly;
``/readyz`` checks the database, the schema, the target (a real Redis that is killed) and the
manager; ``/healthz`` fails when the in-process manager died."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from periodic_manager.api.app import create_app
from periodic_manager.clock import SystemClock, VirtualClock
from periodic_manager.db.migrate import head_revision, pending, upgrade
from periodic_manager.runtime.assemble import build_manager
from periodic_manager.runtime.probe import ProbeWriter, check_probe, manager_health
from periodic_manager.settings import Settings
from tests.conftest import _unavailable
from tests.support.polling import eventually
from tests.support.servers import ManagerProcess, RedisServer, free_port

CLI = [sys.executable, "-m", "periodic_manager"]
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


async def health(directory: Path, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        "health",
        "--probe-dir",
        str(directory),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if not k.startswith("PM_")},
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
    except TimeoutError:  # a hanging probe is a failure, and must not outlive the test
        proc.kill()
        await proc.wait()
        raise AssertionError(f"health {args} hung: no answer within 30 s") from None
    assert proc.returncode is not None
    return proc.returncode, out.decode().strip()


async def test_probe_of_a_frozen_manager_goes_stale_and_health_fails_until_it_runs_again(
    pg_url: str, tmp_path: Path
) -> None:
    await upgrade(pg_url)
    probe_dir = tmp_path / "probe"
    manager = ManagerProcess(
        {
            "PM_DATABASE_URL": pg_url.replace("postgres@", "postgres:probe-pw@"),
            "PM_TARGET": "outbox",
            "PM_PROBE_DIR": str(probe_dir),
            "PM_PROBE_INTERVAL": "0.1",
            "PM_LEADER_ELECTION": "false",
        },
        tmp_path / "manager.log",
    )
    manager.start()
    max_age = 1.0

    def fresh() -> bool:
        return check_probe(probe_dir, "manager", SystemClock().now(), max_age).ok

    try:
        await eventually(lambda: fresh() or not manager.alive(), "first probe write")
        assert manager.alive(), manager.log()
        rc, line = await health(probe_dir, "--max-age", str(max_age))
        assert rc == 0 and line.startswith(f"ok: manager (pid {manager.pid})"), line
        doc = json.loads((probe_dir / "manager.json").read_text())
        assert doc["status"] == "ok" and doc["pid"] == manager.pid and doc["interval_s"] == 0.1
        # The start-up line names the database (password hidden), the schema and the target.
        start = next(
            ln for ln in manager.log().splitlines() if "periodic-manager" in ln and "manager:" in ln
        )
        assert "postgres:***@" in start and f"(schema {head_revision()})" in start
        assert "target outbox" in start and "probe-pw" not in manager.log()

        os.kill(manager.pid, signal.SIGSTOP)  # the event loop cannot run: no more writes
        try:
            await eventually(lambda: not fresh(), "the probe going stale")
            rc, line = await health(probe_dir, "--max-age", str(max_age))
            assert rc == 1 and line.startswith(f"stale: manager (pid {manager.pid})"), line
        finally:
            os.kill(manager.pid, signal.SIGCONT)
        await eventually(fresh, "the probe fresh again")
        rc, line = await health(probe_dir, "--max-age", str(max_age))
        assert rc == 0, line
        assert manager.stop() == 0, manager.log()[-3000:]
        # A clean stop removes the file: a stopped manager is not "alive".
        rc, line = await health(probe_dir)
        assert rc == 1 and line.startswith("missing: "), line
    finally:
        manager.kill()


async def test_probe_reports_an_unhealthy_manager_and_follows_the_clock(tmp_path: Path) -> None:
    clock = VirtualClock(T0)
    reason: list[str | None] = [None]
    writer = ProbeWriter(tmp_path, "manager", lambda: reason[0], clock=clock, interval_s=5.0)
    task = asyncio.create_task(writer.run())
    try:
        await clock.advance(0)
        assert check_probe(tmp_path, "manager", clock.now()).ok
        # Default staleness: three write intervals, at least 30 s.
        assert not check_probe(tmp_path, "manager", clock.now() + timedelta(seconds=31)).ok
        assert check_probe(tmp_path, "manager", clock.now() + timedelta(seconds=29)).ok
        reason[0] = "sync died: RuntimeError: x"  # the form of manager.health()'s reason
        await clock.advance(5)
        verdict = check_probe(tmp_path, "manager", clock.now())
        assert not verdict.ok
        assert verdict.line == f"unhealthy: manager (pid {os.getpid()}): {reason[0]}"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    (tmp_path / "manager.json").write_text("{not json")
    assert check_probe(tmp_path, "manager", clock.now()).line.startswith("unreadable: ")


async def test_health_needs_a_probe_directory_and_a_positive_max_age(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        "health",
        stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("PM_")},
    )
    _, err = await proc.communicate()
    assert proc.returncode == 2 and "PM_PROBE_DIR" in err.decode()
    rc, line = await health(tmp_path, "--max-age", "0")
    assert rc == 2 and "--max-age" in line


async def test_a_probe_written_in_the_future_is_clock_skew_not_fresh(tmp_path: Path) -> None:
    """After the clock steps back, a frozen manager's last probe lies in the future: it must not
    count as fresh until the clock catches up with it."""
    clock = VirtualClock(T0)
    ProbeWriter(tmp_path, "manager", lambda: None, clock=clock, interval_s=5.0).write()
    assert check_probe(tmp_path, "manager", T0 - timedelta(seconds=4)).ok  # slew: tolerated
    verdict = check_probe(tmp_path, "manager", T0 - timedelta(seconds=6))
    assert not verdict.ok
    assert verdict.line == (
        f"clock skew: manager (pid {os.getpid()}) wrote its probe 6.0 s in the future (max 5 s): "
        "the clock stepped back, or the clocks disagree"
    )
    # The command, on the real clock: a probe an hour ahead fails it.
    ahead = VirtualClock(SystemClock().now() + timedelta(hours=1))
    ProbeWriter(tmp_path, "manager", lambda: None, clock=ahead, interval_s=5.0).write()
    rc, line = await health(tmp_path)
    assert rc == 1 and line.startswith(
        f"clock skew: manager (pid {os.getpid()}) wrote its probe 3"
    ), line


async def test_health_reads_only_a_regular_probe_file_of_bounded_size(tmp_path: Path) -> None:
    """A FIFO (no writer: an open for reading would block) or a link to /dev/zero (endless) in
    place of the probe file: ``health`` answers at once, exit 1, instead of hanging."""
    probe = tmp_path / "manager.json"
    os.mkfifo(probe)
    rc, line = await health(tmp_path)
    assert rc == 1 and line == f"unreadable: probe file {probe}: not a regular file (a FIFO)", line
    probe.unlink()
    probe.symlink_to("/dev/zero")
    rc, line = await health(tmp_path)
    assert rc == 1 and line.endswith("not a regular file (a device or socket)"), line
    probe.unlink()
    probe.write_bytes(b" " * (1 << 20))
    rc, line = await health(tmp_path)
    assert rc == 1 and line.endswith("larger than 65536 bytes: not a probe file"), line
    # A link to a regular probe file is followed.
    real = tmp_path / "real" / "manager.json"
    ProbeWriter(real.parent, "manager", lambda: None, clock=SystemClock(), interval_s=5.0).write()
    probe.unlink()
    probe.symlink_to(real)
    rc, line = await health(tmp_path)
    assert rc == 0 and line.startswith(f"ok: manager (pid {os.getpid()})"), line


def test_manager_health_is_the_managers_own_check() -> None:
    class Fake:
        reason: str | None = None

        def health(self) -> str | None:
            return self.reason

    fake = Fake()
    assert manager_health(fake)() is None  # health() is all it reads
    fake.reason = "publisher stuck for 12 s"
    assert manager_health(fake)() == "publisher stuck for 12 s"


# -- readiness -------------------------------------------------------------------------------


@pytest.fixture
async def redis_server() -> AsyncIterator[RedisServer]:
    try:
        server = RedisServer()
    except RuntimeError as exc:
        _unavailable("redis-server", exc)
    with server:
        yield server


async def test_readyz_fails_while_the_target_is_unreachable(
    pg_url: str, redis_server: RedisServer, redis_prefix: str
) -> None:
    await upgrade(pg_url)
    settings = Settings(
        database_url=pg_url,
        target="redis",
        redis_url=redis_server.url,
        stream_prefix=redis_prefix,
        leader_election=False,
        heartbeat_interval=0.2,
    )
    app = create_app(settings, manager_factory=lambda engine: build_manager(settings, engine))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            r = await c.get("/readyz")
            assert r.status_code == 200 and r.json()["checks"]["target"] == "ok", r.text
            redis_server.kill()
            r = await c.get("/readyz")
            assert r.status_code == 503, r.text
            body = r.json()
            assert (
                body["checks"]["target"].startswith("error: ")
                and body["detail"] == "not ready: target"
            )
            assert body["checks"]["database"] == "ok" and body["checks"]["manager"] == "leader"
            redis_server.start()
            r = await c.get("/readyz")
            assert r.status_code == 200 and r.json()["checks"]["target"] == "ok", r.text


async def test_readyz_fails_on_a_schema_behind_head_or_an_unreachable_database(pg_url: str) -> None:
    shipped = pending(None)
    await upgrade(pg_url, shipped[-2])
    app = create_app(Settings(database_url=pg_url))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            r = await c.get("/readyz")
    assert r.status_code == 503
    checks = r.json()["checks"]
    assert checks["database"] == "ok" and checks["schema"].startswith(
        f"the schema is at {shipped[-2]}"
    )
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/x"
    app = create_app(Settings(database_url=nowhere))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            r = await c.get("/readyz")
    assert r.status_code == 503
    checks = r.json()["checks"]
    assert checks["database"].startswith("error: ") and "connection refused" in checks["database"]
    assert checks["schema"] == "unknown"


async def test_healthz_fails_when_the_in_process_manager_died(db_url: str, tmp_path: Path) -> None:
    class Fake:
        is_leader = True
        failed: BaseException | None = None
        standing_down: str | None = None

        async def start(self) -> None: ...

        async def stop(self) -> None: ...

        def request_sync(self) -> None: ...

        def health(self) -> str | None:
            return None if self.failed is None else f"the fake's health: {self.failed!r}"

    fake = Fake()
    settings = Settings(database_url=db_url, probe_dir=str(tmp_path), probe_interval=3600)
    app = create_app(settings, manager_factory=lambda engine: fake)
    async with app.router.lifespan_context(app):
        # `run` with PM_PROBE_DIR writes run.json too (the first write is at start).
        assert check_probe(tmp_path, "run", SystemClock().now()).ok
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            assert (await c.get("/healthz")).json() == {"status": "ok"}
            fake.failed = RuntimeError("scheduler died")
            r = await c.get("/healthz")
            assert r.status_code == 503 and "scheduler died" in r.json()["detail"]
    assert not (tmp_path / "run.json").exists()


def test_an_unwritable_probe_directory_stops_the_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from periodic_manager.cli.main import main

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("PM_PROBE_DIR", str(blocker / "probe"))  # a directory under a file
    for command in (["manager"], ["run", "--port", "0"]):
        code = main([*command, "--database-url", f"sqlite:///{tmp_path}/pm.db"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and len(err) == 1, err
        assert err[0].startswith(
            f"periodic-manager: error: PM_PROBE_DIR: cannot write to {blocker / 'probe'}"
        )
    assert not (tmp_path / "pm.db").exists()  # checked before anything else


async def test_readyz_pings_the_broker_celery_publishes_to_whatever_its_transport(
    pg_url: str, redis_url: str, redis_prefix: str, amqp_url: str
) -> None:
    """Celery on RabbitMQ: /readyz said ready while RabbitMQ was down (it asked only the claims'
    Redis). RabbitMQ is reached through a proxy the test cuts and restores."""
    from tests.conftest import amqp_address, amqp_through
    from tests.support.tcpproxy import TcpProxy

    await upgrade(pg_url)
    rabbit = TcpProxy(*amqp_address())
    await rabbit.start()
    amqp = amqp_through(rabbit.port)
    settings = Settings(
        database_url=pg_url,
        target="celery",
        celery_broker_url=amqp,
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        leader_election=False,
        celery_publish_timeout=1.0,
    )
    app = create_app(settings, manager_factory=lambda engine: build_manager(settings, engine))
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
                r = await c.get("/readyz")
                assert r.status_code == 200 and r.json()["checks"]["target"] == "ok", r.text
                await rabbit.cut()
                r = await c.get("/readyz")
                assert r.status_code == 503, r.text
                assert r.json()["checks"]["target"].startswith("error: ")
                await rabbit.restore()
                r = await c.get("/readyz")
                assert r.status_code == 200 and r.json()["checks"]["target"] == "ok", r.text
    finally:
        await rabbit.close()


def test_the_start_up_line_names_the_broker_celery_publishes_to(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """With PM_CELERY_APP naming an app with its own broker, the line named PM_REDIS_URL."""
    from periodic_manager.runtime.startup import describe_targets

    module = f"pm_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from celery import Celery\n"
        "app = Celery('x', broker='amqp://guest:s3cret@127.0.0.1:5672//', set_as_current=False)\n"
        "app.conf.result_backend = 'redis://:pw@127.0.0.1:6379/4'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    settings = Settings(
        target="celery", celery_app=f"{module}:app", redis_url="redis://127.0.0.1:6379/3"
    )
    assert describe_targets(settings) == (
        "celery (amqp://guest:***@127.0.0.1:5672//, claims redis://127.0.0.1:6379/3, "
        "results redis://:***@127.0.0.1:6379/4)"
    )
