"""options.pause_after_failures: a schedule whose tasks fail pauses itself after N failures in a
row (a real RQ worker runs them), with a note, paused by 'manager', in GET /schedules/{id} and in
its change history; a success in between starts the count again; a restart keeps the count. The
option is refused (422, row error, import, code API) where the target cannot tell a failed task.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from arq.jobs import serialize_result

from periodic_manager.contracts import FailureCount
from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import upgrade
from periodic_manager.db.store import DatabaseRuntimeStore
from periodic_manager.errors import ConfigError
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.schedules import failures
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.rules import TargetSet, validate_target
from periodic_manager.settings import Settings
from periodic_manager.targets.arq import result_success
from periodic_manager.targets.celery.results import outcome_of
from periodic_manager.targets.memory import MemoryTarget
from periodic_manager.targets.procrastinate import ProcrastinateTarget
from periodic_manager.targets.rq import RqTarget
from tests.conftest import new_pg_database
from tests.support import rawsql
from tests.support.celery_arq_rig import Rig, api_rig, at, procrastinate_cli, rq_burst
from tests.targets.test_procrastinate_target import make_task

FIELD = "options.pause_after_failures"


# -- the option and the count -------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 1001, True, 2.0, "3", None])
def test_bad_values_name_the_option(value: Any) -> None:
    with pytest.raises(ConfigError, match="must be an integer from 1 to 1000") as err:
        PeriodicTaskConfig.create(
            name="x", spec="@hourly", task_type="t", options={"pause_after_failures": value}
        )
    assert err.value.field == FIELD


def test_the_count_resets_on_success_skips_unknown_and_waits_for_pending() -> None:
    t = [at(12, m) for m in range(6)]
    runs: list[tuple[datetime, str | None]] = [
        (t[0], "a"),
        (t[1], "b"),
        (t[2], None),
        (t[3], "c"),
        (t[4], "d"),
        (t[5], "e"),
    ]
    states = {"a": "failed", "b": "succeeded", "c": "unknown", "d": "failed", "e": "pending"}
    counted = failures.count(5, runs, states, at(12, 6))
    # a: 6, b: 0, the run without an id and c: neither way, d: 1, e: not yet decided.
    assert counted == failures.Counted(1, t[4], "d")
    # A task pending for longer than UNDECIDED_FOR no longer holds the count up.
    late = failures.count(0, runs[5:], states, t[5] + failures.UNDECIDED_FOR)
    assert late == failures.Counted(0, t[5], None)


def test_arq_results_are_read_without_unpickling() -> None:
    for success, result in [(True, {"s": False}), (False, ValueError("s")), (True, ("s", False))]:
        raw = serialize_result(
            "f", ("s", False), {"s": False}, 1, 1, success, result, 1, 2, "r", "q", "id"
        )
        assert raw is not None and result_success(raw) is success
    assert result_success(b"not a pickle") is None and result_success(b"") is None


def test_celery_statuses_as_outcomes() -> None:
    assert [
        outcome_of(s) for s in ("SUCCESS", "FAILURE", "REVOKED", "PENDING", "STARTED", None)
    ] == [
        "succeeded",
        "failed",
        "unknown",
        "pending",
        "pending",
        "pending",
    ]


async def test_procrastinate_tells_failed_jobs_from_succeeded_ones_after_a_real_worker(
    tmp_path: Path,
) -> None:
    async with new_pg_database() as url:
        await upgrade(url)
        await asyncio.to_thread(procrastinate_cli, url, tmp_path / "out", "schema", "--apply")
        target = ProcrastinateTarget.from_url(url)
        try:
            ok, bad = make_task("ok", {}), make_task("bad", {}, task_type="fail")
            results = await target.enqueue([ok, bad], at(12, 1))
            assert all(r.status == "enqueued" and r.message_id for r in results)
            asked = [str(r.message_id) for r in results] + ["123456789", "not-a-job"]
            assert await target.outcomes({}, asked) == ["pending", "pending", "unknown", "unknown"]
            await asyncio.to_thread(
                procrastinate_cli,
                url,
                tmp_path / "out",
                "worker",
                "--one-shot",
                "--no-listen-notify",
            )
            assert await target.outcomes({}, asked) == ["succeeded", "failed", "unknown", "unknown"]
        finally:
            await target.close()


# -- refused where the target cannot tell a failed task -----------------------------------------


def test_targets_that_cannot_tell_a_failed_task_refuse_the_option() -> None:
    targets = Settings(
        target="outbox", targets=("redis", "rq", "arq", "dramatiq")
    ).configured_targets()
    assert set(targets.no_failure) == {"outbox", "redis", "dramatiq"}
    validate_target({"pause_after_failures": 3, "target": "rq"}, targets)
    for options, target in (({}, "outbox"), ({"target": "redis"}, "redis")):
        with pytest.raises(
            ConfigError, match=f"the {target} target cannot tell a failed task"
        ) as e:
            validate_target({"pause_after_failures": 3, **options}, targets)
        assert e.value.field == FIELD and e.value.code == "no-failure-signal"
    assert isinstance(TargetSet(("rq",)).no_failure, dict)
    celery = Settings(target="celery").configured_targets()
    assert "PM_CELERY_RESULT_BACKEND" in celery.no_failure["celery"]
    with pytest.raises(ConfigError, match="cannot tell a failed task") as e:
        PeriodicTaskManager(None, MemoryTarget()).register(
            PeriodicTaskConfig.create(
                name="x", spec="@hourly", task_type="t", options={"pause_after_failures": 2}
            )
        )
    assert e.value.field == FIELD


async def test_a_422_on_the_outbox_and_redis_and_a_row_error_for_sql(
    db_url: str, redis_url: str, redis_prefix: str
) -> None:
    # The redis target's keys (its sentinel) go under the test's prefix, and with the test.
    settings = Settings(
        database_url=db_url,
        target="outbox",
        targets=("redis",),
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        redis_group="workers",
        grace=30,
        heartbeat_interval=5,
    )
    async with api_rig(db_url, settings) as rig:
        for options in ({}, {"target": "redis"}):
            body = {
                "name": "x",
                "spec": "* * * * *",
                "task_type": "t",
                "options": {"pause_after_failures": 3, **options},
            }
            resp = await rig.client.post("/schedules", json=body)
            assert resp.status_code == 422, resp.text
            [error] = resp.json()["errors"]
            assert error["field"] == FIELD and error["code"] == "no-failure-signal"
            assert "cannot tell a failed task" in error["reason"]
        options = "'{\"pause_after_failures\": 3}'"
        bad_id = await rawsql.insert(db_url, "by.sql", options=options)
        await rig.advance_to(at(12, 0, 31))  # the sync at 12:00:30 reads it
        [listed] = [
            e
            for e in (await rig.client.get("/entries")).json()["items"]
            if e["schedule_id"] == bad_id
        ]
        assert listed["status"] == "error" and "cannot tell a failed task" in listed["last_error"]
        detail = (await rig.client.get(f"/schedules/{bad_id}")).json()
        assert FIELD in json.dumps(detail["errors"])


def test_import_refuses_the_option_on_the_outbox(
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    redis_url: str,
    redis_prefix: str,
) -> None:
    from periodic_manager.cli.main import main
    from periodic_manager.db.migrate import upgrade_sync

    upgrade_sync(sqlite_url)
    # a dotted task_type: RQ refuses any other at write time (plugins/task_rules.py)
    doc = [
        {
            "name": "n",
            "spec": "@daily",
            "task_type": "jobs.t",
            "options": {"pause_after_failures": 2},
        }
    ]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("PM_TARGET", "outbox")
    assert main(["import", str(path), "--database-url", sqlite_url]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"entry 1 ('n'): {FIELD}:" in line and "cannot tell a failed task" in line
    monkeypatch.setenv("PM_TARGET", "rq")
    monkeypatch.setenv("PM_REDIS_URL", redis_url)
    monkeypatch.setenv("PM_STREAM_PREFIX", redis_prefix)
    assert main(["import", str(path), "--database-url", sqlite_url]) == 0


# -- a real RQ worker ---------------------------------------------------------------------------


class Flaky:
    """A schedule whose RQ job fails while the test says so, run by ``rq worker --burst``."""

    def __init__(
        self, redis_client: aioredis.Redis, redis_url: str, prefix: str, tmp_path: Path
    ) -> None:
        self.redis = redis_client
        self.url = redis_url
        self.prefix = prefix
        self.queue = f"{prefix}-jobs"
        self.log = tmp_path / "rq.log"

    def target(self) -> RqTarget:
        return RqTarget.from_url(self.url, prefix=self.prefix, key_prefix=self.prefix)

    async def fail(self, failing: bool) -> None:
        if failing:
            await self.redis.set(f"{self.prefix}:out:fail", "1")
        else:
            await self.redis.delete(f"{self.prefix}:out:fail")

    async def run_jobs(self, n: int) -> None:
        """The worker runs what is queued, which must be ``n`` jobs."""
        assert await self.redis.llen(f"{self.prefix}:queue:{self.queue}") == n
        await asyncio.to_thread(rq_burst, self.prefix, self.queue, self.url, self.log)


async def until_paused(rig: Rig, sid: int, until: datetime) -> dict[str, Any] | None:
    """Advance the clock in heartbeat steps (the loop's interval) up to ``until``; the schedule
    once paused, None if it never was."""
    while rig.clock.now() < until:
        await rig.advance_to(min(until, rig.clock.now() + timedelta(seconds=5)))
        body: dict[str, Any] = (await rig.client.get(f"/schedules/{sid}")).json()
        if body["paused"] is not None:
            return body
    return None


async def test_a_failing_schedule_pauses_itself_after_n_failures_in_a_row(
    db_url: str, redis_client: aioredis.Redis, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    flaky = Flaky(redis_client, redis_url, redis_prefix, tmp_path)
    settings = Settings(
        database_url=db_url,
        target="rq",
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        grace=30,
        heartbeat_interval=5,
        sync_interval=30,
    )
    body = {
        "name": "flaky",
        "spec": "* * * * *",
        "task_type": "tests.support.rq_worker_app.flaky",
        "options": {"queue": flaky.queue, "pause_after_failures": 3},
    }
    async with api_rig(db_url, settings, flaky.target) as rig:
        resp = await rig.client.post("/schedules", json=body)
        assert resp.status_code == 201, resp.text
        sid = resp.json()["id"]
        # 12:01 and 12:02 fail, 12:03 succeeds (the count starts again), 12:04 fails.
        for minute, failing in ((1, True), (2, True), (3, False), (4, True)):
            await rig.advance_to(at(12, minute, 30))
            await flaky.fail(failing)
            await flaky.run_jobs(1)
        # Without the reset it would be paused now (three failures): it is not.
        assert await until_paused(rig, sid, at(12, 4, 55)) is None
    # A restart: the count (one failure) is in the database.
    async with api_rig(db_url, settings, flaky.target, start=at(12, 4, 56)) as rig:
        await rig.advance_to(at(12, 5, 30))
        await flaky.run_jobs(1)  # 12:05 fails: two in a row
        assert await until_paused(rig, sid, at(12, 5, 55)) is None
        await rig.advance_to(at(12, 6, 30))
        await flaky.run_jobs(1)  # 12:06 fails: three in a row
        paused = await until_paused(rig, sid, at(12, 7, 10))
        assert paused is not None, "not paused after three failures in a row"
        assert paused["enabled"] is False and paused["paused"]["by"] == "manager"
        note = paused["paused"]["note"]
        assert note.startswith("paused by the manager after 3 consecutive failed tasks (last: ")
        changes = (await rig.client.get(f"/schedules/{sid}/changes")).json()["items"]
        assert changes[0]["action"] == "paused" and changes[0]["source"] == "manager"
        assert changes[0]["actor"] == rig.managers[0].manager_id
        assert changes[0]["changes"]["paused_note"]["after"] == note
        # The pause reaches the manager like any edit: nothing more is sent (a slot due between
        # the third failure and the pause may be queued: the count is taken when it is seen).
        queue = f"{redis_prefix}:queue:{flaky.queue}"
        queued = await redis_client.llen(queue)
        assert queued <= 1
        await rig.advance_to(at(12, 10, 30))
        assert rig.managers[0].entry(sid) is None
        assert await redis_client.llen(queue) == queued
        await flaky.run_jobs(queued)
        # Resumed, it counts from 0 again: one more failure does not pause it.
        assert (await rig.client.post(f"/schedules/{sid}/resume")).status_code == 200
        await rig.advance_to(at(12, 11, 30))
        await flaky.run_jobs(1)
        assert await until_paused(rig, sid, at(12, 12, 20)) is None


async def test_the_store_reads_hostile_counts_and_runs_without_failing(db_url: str) -> None:
    sqlite = db_url.startswith("sqlite")
    ts = rawsql.instant(db_url, "2024-05-01 12:0{}:00")
    await rawsql.execute(
        db_url,
        "INSERT INTO pm_schedule_state (schedule_key, name, updated_at, consecutive_failures)"
        f" VALUES ('7', 'x', {ts.format(0)}, 4611686018427387904)",
    )
    rows = [
        (1, "enqueued", "'a'"),
        (2, "skipped", "NULL"),
        (3, "duplicate", "'b'"),
        (3, "enqueued", "'b'"),
    ]
    if sqlite:  # SQLite keeps any text in any column
        rows.append((None, "enqueued", "'c'"))
    for minute, status, message_id in rows:
        slot = ts.format(minute) if minute is not None else "'garbage'"
        await rawsql.execute(
            db_url,
            "INSERT INTO pm_runs (schedule_key, name, slot_at, status, at, lateness_ms, message_id)"
            f" VALUES ('7', 'x', {slot}, '{status}', {slot}, 0, {message_id})",
        )
    engine = create_engine(db_url)
    try:
        store = DatabaseRuntimeStore(engine)
        stored = await store.failure_count("7", 10)
        # An impossible count reads 0; a skipped slot is no task; a slot found twice is one task.
        assert stored == FailureCount(0, None, [(at(12, 1), "a"), (at(12, 3), "b")])
        await store.save_failure_count("7", 2, at(12, 3))
        await store.save_failure_count("7", 9, at(12, 1))  # an older walk never moves it back
        assert await store.failure_count("7", 10) == FailureCount(2, at(12, 3), [])
    finally:
        await engine.dispose()
