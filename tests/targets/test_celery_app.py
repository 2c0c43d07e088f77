"""The user's Celery app (PM_CELERY_APP): its default queue and task_routes decide where a task
without ``options.queue`` goes, on both ways out (written to Redis directly, or through kombu),
checked with a real worker; and the settings that build the target."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from celery import Celery
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.cli.main import main
from periodic_manager.contracts import Task
from periodic_manager.db.engine import create_engine
from periodic_manager.runtime.assemble import build_target
from periodic_manager.settings import Settings
from periodic_manager.targets.base import task_id_for
from periodic_manager.targets.celery.target import CeleryTarget
from tests.support.celery_arq_rig import WorkerProcess, celery_worker, records, wait_for

SLOT = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)


def task(name: str, task_type: str, queue: str | None = None) -> Task:
    key = f"{name}:2024-05-01T12:01:00Z"
    return Task(
        id=task_id_for(key),
        name=name,
        task_type=task_type,
        payload={"n": name},
        queue=queue or "default",
        options={} if queue is None else {"queue": queue},
        idempotency_key=key,
        scheduled_at=SLOT,
        expires_at=SLOT + timedelta(seconds=30),
    )


def user_app(redis_url: str, prefix: str) -> Celery:
    """A team's Celery app: its own default queue, a route, kombu keys under the test's prefix."""
    app = Celery("team", broker=redis_url, set_as_current=False)
    app.conf.update(
        task_default_queue=f"{prefix}.dflt",
        task_routes={"pmtest.other": {"queue": f"{prefix}.routed"}},
        broker_transport_options={"global_keyprefix": f"{prefix}:"},
        result_backend=redis_url,  # a backend the target must not use (it would track every task)
    )
    return app


@pytest.fixture
def app_worker(redis_prefix: str, redis_url: str, tmp_path: Path) -> Iterator[WorkerProcess]:
    queues = [f"{redis_prefix}.{q}" for q in ("q", "dflt", "routed")]
    proc = celery_worker(redis_prefix, queues, tmp_path / "celery.log", redis_url)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.mark.parametrize("fast_path", [True, False], ids=["direct", "kombu"])
async def test_options_queue_the_apps_default_queue_and_its_routes_reach_their_worker_queues(
    app_worker: WorkerProcess,
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
    fast_path: bool,
) -> None:
    p = redis_prefix
    target = CeleryTarget.from_app(user_app(redis_url, p), prefix=p, fast_path=fast_path)
    assert (target.fast_path_off is None) is fast_path
    assert target.app.conf.result_backend is None
    tasks = [
        task(f"{p}.explicit", "pmtest.record", f"{p}.q"),  # options.queue
        task(f"{p}.default", "pmtest.record"),  # the app's task_default_queue
        task(f"{p}.routed", "pmtest.other"),  # the app's task_routes
        task(f"{p}.override", "pmtest.other", f"{p}.q"),  # options.queue beats the route
    ]
    try:
        assert [r.status for r in await target.enqueue(tasks, SLOT)] == ["enqueued"] * 4
    finally:
        await target.close()

    async def four() -> bool:
        return len(await records(redis_client, p)) >= 4

    await wait_for(four, "4 task runs", app_worker)
    got = {r["periodic_name"]: r for r in await records(redis_client, p)}
    assert {name: run["routing_key"] for name, run in got.items()} == {
        f"{p}.explicit": f"{p}.q",
        f"{p}.default": f"{p}.dflt",
        f"{p}.routed": f"{p}.routed",
        f"{p}.override": f"{p}.q",
    }
    for t in tasks:
        assert (got[t.name]["id"], got[t.name]["kwargs"]) == (t.id, {"n": t.name})


# -- settings ---------------------------------------------------------------------------------


@pytest.fixture
def app_module(
    redis_prefix: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """An importable module holding a user app, as PM_CELERY_APP names it."""
    name = f"{redis_prefix}_celeryapp"
    (tmp_path / f"{name}.py").write_text(
        "from celery import Celery\n"
        f"app = Celery('team', broker={redis_url!r}, set_as_current=False)\n"
        f"app.conf.task_default_queue = '{redis_prefix}.dflt'\n"
        f"app.conf.broker_transport_options = {{'global_keyprefix': '{redis_prefix}:'}}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


async def built(settings: Settings) -> tuple[CeleryTarget, AsyncEngine]:
    engine = create_engine(settings.database_url)
    target = build_target(settings, engine)
    assert isinstance(target, CeleryTarget)
    return target, engine


async def test_pm_celery_app_builds_a_target_honouring_the_apps_default_queue(
    app_module: str, redis_client: aioredis.Redis, redis_prefix: str, sqlite_url: str
) -> None:
    settings = Settings(
        database_url=sqlite_url,
        target="celery",
        celery_app=f"{app_module}:app",
        stream_prefix=redis_prefix,
        celery_publish_timeout=2.5,
    )
    target, engine = await built(settings)
    try:
        assert target.fast_path_off is None and target.timeout == 2.5
        assert target.writer is not None and target.writer.timeout == 2.5
        one = task(f"{redis_prefix}.a", "pmtest.record")
        assert [r.status for r in await target.enqueue([one], SLOT)] == ["enqueued"]
    finally:
        await target.close()
        await engine.dispose()
    assert await redis_client.llen(f"{redis_prefix}:{redis_prefix}.dflt") == 1
    assert await redis_client.exists(f"{redis_prefix}:claim:{one.idempotency_key}") == 1


async def test_pm_celery_fast_path_false_publishes_everything_through_kombu(
    app_module: str, sqlite_url: str, redis_prefix: str
) -> None:
    settings = Settings(
        database_url=sqlite_url,
        target="celery",
        celery_app=app_module,
        celery_fast_path=False,
        stream_prefix=redis_prefix,
    )
    target, engine = await built(settings)
    try:
        assert target.writer is None and "PM_CELERY_FAST_PATH" in (target.fast_path_off or "")
    finally:
        await target.close()
        await engine.dispose()


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("no such module!", "must be 'package.module:app'"),
        ("pm_no_such_module_xyz:app", "cannot import 'pm_no_such_module_xyz'"),
        ("periodic_manager.settings:Settings", "is not a Celery app"),
        ("periodic_manager.settings:nothing", "has no attribute 'nothing'"),
    ],
)
def test_a_bad_pm_celery_app_is_refused_at_start_naming_the_setting(
    value: str, reason: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValidationError) as err:
        Settings(celery_app=value)
    assert err.value.errors()[0]["loc"] == ("celery_app",) and reason in str(err.value)
    monkeypatch.setenv("PM_CELERY_APP", value)
    assert main(["migrate"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "PM_CELERY_APP" in lines[0] and reason in lines[0]


def test_a_celery_app_without_a_broker_url_is_refused(redis_prefix: str) -> None:
    app = Celery("nobroker", set_as_current=False)
    with pytest.raises(ValueError, match="no broker_url"):
        CeleryTarget.from_app(app, prefix=redis_prefix)


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_bad_publish_timeout_is_refused_at_start(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PM_CELERY_PUBLISH_TIMEOUT", value)
    with pytest.raises(ValidationError) as err:
        Settings()
    assert err.value.errors()[0]["loc"] == ("celery_publish_timeout",)


def test_publisher_confirms_stay_on_whatever_the_apps_transport_options_say() -> None:
    from periodic_manager.targets.celery.app import publishing_app

    settings = {
        "broker_url": "amqp://guest:guest@127.0.0.1:5672//",
        "broker_transport_options": {"confirm_publish": False, "max_retries": 1},
    }
    app = publishing_app("team", settings, broker_url=None, timeout=2.0)
    try:
        options = app.conf.broker_transport_options
        assert options["confirm_publish"] is True  # a claim is "sent" only once confirmed
        assert options["max_retries"] == 1  # the app's other options are kept
    finally:
        app.close()
