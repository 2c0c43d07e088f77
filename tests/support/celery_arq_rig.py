"""Shared by the Celery, arq and routing tests: the API with in-process managers on a virtual clock,
real worker subprocesses, and bounded polls of what the workers recorded.

Time for the managers is a VirtualClock (slots are driven, never waited for); only the workers,
being other processes, are waited for, with polls bounded by a deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis

from periodic_manager.api.app import create_app
from periodic_manager.api.state import state_of
from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import Target
from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import upgrade
from periodic_manager.runtime.assemble import build_manager
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.settings import Settings
from tests.support import ROOT
from tests.support.polling import eventually

T0 = datetime(2024, 5, 1, 12, 0, 0, 500000, tzinfo=UTC)  # half a second past a minute
WAIT_S = 30.0  # bound of every wait for a worker


def at(hh: int, mm: int, ss: int = 0) -> datetime:
    return datetime(2024, 5, 1, hh, mm, ss, tzinfo=UTC)


def iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Rig:
    client: httpx.AsyncClient
    clock: VirtualClock
    settings: Settings
    managers: list[PeriodicTaskManager]
    make_manager: Callable[[], Awaitable[PeriodicTaskManager]]

    async def advance_to(self, instant: datetime) -> None:
        async def settle() -> None:
            for manager in self.managers:
                await manager.wait_settled(self.clock.now())

        await self.clock.advance_to(instant, settle=settle)

    async def second_manager(self) -> PeriodicTaskManager:
        """Another manager on the same database, with a target of its own (started, synced)."""
        manager = await self.make_manager()
        self.managers.append(manager)
        return manager

    async def create(self, **body: Any) -> dict[str, Any]:
        body.setdefault("spec", "* * * * *")
        resp = await self.client.post("/schedules", json=body)
        assert resp.status_code == 201, resp.text
        created: dict[str, Any] = resp.json()
        return created


@asynccontextmanager
async def api_rig(
    db_url: str,
    settings: Settings,
    make_target: Callable[[], Target] | None = None,
    *,
    start: datetime = T0,
) -> AsyncIterator[Rig]:
    """The API and one in-process manager (more on demand), each manager with ``make_target()``
    (default: the target ``settings`` configure, built and closed by the manager), from
    ``start`` on a VirtualClock."""
    await upgrade(db_url)
    if settings.coordination == "auto":
        # One leader: this VirtualClock jumps minutes at once, past the trust of partition
        # leases (their expiry is the database's real time); see test_partition_moves.py.
        settings = settings.model_copy(update={"coordination": "leader"})
    clock = VirtualClock(start)
    engine = create_engine(db_url)
    targets: list[Target] = []
    managers: list[PeriodicTaskManager] = []

    def manager_for(eng: Any) -> PeriodicTaskManager:
        if make_target is None:
            return build_manager(settings, eng, clock=clock)
        targets.append(make_target())
        return build_manager(settings, eng, clock=clock, target=targets[-1])

    async def make_manager() -> PeriodicTaskManager:
        manager = manager_for(engine)
        await manager.start()
        return manager

    app = create_app(settings, clock=clock, engine=engine, manager_factory=manager_for)
    extra: list[PeriodicTaskManager] = []
    try:
        async with app.router.lifespan_context(app):
            managers.append(state_of(app).manager)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://localhost"
            ) as client:
                rig = Rig(client, clock, settings, managers, make_manager)
                try:
                    yield rig
                finally:
                    extra = managers[1:]
                    for manager in extra:
                        await manager.stop()
    finally:
        for target in targets:
            await target.close()
        await engine.dispose()


@dataclass
class WorkerProcess:
    """A worker subprocess; its output goes to ``log`` (shown when a wait fails)."""

    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, env={**os.environ, **self.env}, stdout=out, stderr=out
            )

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def celery_worker(prefix: str, queues: list[str], log: Path, broker: str) -> WorkerProcess:
    return WorkerProcess(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.support.celery_worker_app",
            "worker",
            "--pool=solo",
            "-Q",
            ",".join(queues),
            "--hostname",
            f"{prefix}@%h",
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
            "-l",
            "INFO",
        ],
        {
            "PM_TEST_BROKER": broker,
            "PM_TEST_OUT": f"{prefix}:out",
            "PM_TEST_KEYPREFIX": f"{prefix}:",
        },
        log,
    )


def arq_worker(prefix: str, queue: str, log: Path, redis_url: str) -> WorkerProcess:
    return WorkerProcess(
        [sys.executable, "-m", "arq", "tests.support.arq_worker_app.WorkerSettings"],
        {"PM_TEST_REDIS": redis_url, "PM_TEST_OUT": f"{prefix}:out", "PM_TEST_QUEUE": queue},
        log,
    )


def rq_burst(prefix: str, queue: str, redis_url: str, log: Path) -> None:
    """``rq worker --burst`` on ``queue`` with RQ's key prefix ``prefix``: runs every queued job
    (each records what it received, tests/support/rq_worker_app.py, in ``<prefix>:out``), then
    exits."""
    env = {
        **os.environ,
        "RQ_KEY_PREFIX": prefix,
        "PM_TEST_REDIS": redis_url,
        "PM_TEST_OUT": f"{prefix}:out",
    }
    argv = [
        sys.executable,
        "-m",
        "rq.cli",
        "worker",
        "--burst",
        "--url",
        redis_url,
        "--name",
        f"{prefix}-worker",
        queue,
    ]
    with open(log, "wb") as out:
        done = subprocess.run(argv, cwd=ROOT, env=env, stdout=out, stderr=out, timeout=60)
    assert done.returncode == 0, log.read_text(errors="replace")[-3000:]


PROCRASTINATE_APP = "tests.support.procrastinate_app.app"


def procrastinate_cli(url: str, out: Path, *args: str) -> str:
    """The ``procrastinate`` CLI on the test app (tests/support/procrastinate_app.py) and the
    database ``url`` (bounded); its output. The app's task records in the file ``out``."""
    libpq = url.replace("postgresql+asyncpg://", "postgresql://")
    env = {**os.environ, "PM_TEST_PG": libpq, "PM_TEST_OUT": str(out)}
    argv = [sys.executable, "-m", "procrastinate", f"--app={PROCRASTINATE_APP}", *args]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done.stdout + done.stderr


async def wait_for(
    check: Callable[[], Awaitable[bool]],
    what: str,
    worker: WorkerProcess | Sequence[WorkerProcess] | None = None,
) -> None:
    """Poll ``check`` until it holds, at most WAIT_S seconds of wall time (a worker is another
    process: only its progress is waited for, never a slot). Fails at once if one of the
    ``worker`` processes exits, and shows their logs when it fails."""
    workers = [] if worker is None else [worker] if isinstance(worker, WorkerProcess) else worker

    async def holds() -> bool:
        if await check():
            return True
        for w in workers:
            if w.proc is not None and w.proc.poll() is not None:
                raise AssertionError(f"the worker exited while waiting for {what}\n{w.tail()}")
        return False

    def logs() -> str:
        return "--- worker log ---\n" + "\n".join(w.tail() for w in workers)

    await eventually(holds, what, seconds=WAIT_S, detail=logs)


async def records(client: aioredis.Redis, prefix: str) -> list[dict[str, Any]]:
    """What the worker recorded, in execution order."""
    return [json.loads(line) for line in await client.lrange(f"{prefix}:out", 0, -1)]


MINUTE = timedelta(minutes=1)
