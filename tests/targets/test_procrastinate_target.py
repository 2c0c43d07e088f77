"""The procrastinate target against a real ``procrastinate worker --one-shot`` on a fresh
PostgreSQL database: the manager's migrations and procrastinate's schema
(``procrastinate schema --apply``) in one database, as deployed.

The worker's task records what it received (tests/support/procrastinate_app.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from pydantic import ValidationError

from periodic_manager.contracts import Task
from periodic_manager.db.engine import create_engine, normalize_url
from periodic_manager.db.migrate import upgrade
from periodic_manager.errors import TargetError
from periodic_manager.runtime.assemble import build_target
from periodic_manager.runtime.startup import describe_targets
from periodic_manager.settings import Settings
from periodic_manager.targets.base import task_id_for
from periodic_manager.targets.procrastinate import ProcrastinateTarget
from tests.conftest import new_pg_database
from tests.support.celery_arq_rig import procrastinate_cli as procrastinate

SLOT = datetime(2024, 5, 1, 12, 1, tzinfo=UTC)


def make_task(name: str, payload: Any, queue: str = "default", **options: Any) -> Task:
    key = f"{name}:2024-05-01T12:01:00Z"
    return Task(
        id=task_id_for(key),
        name=name,
        task_type=options.pop("task_type", "record"),
        payload=payload,
        queue=queue,
        options={"queue": queue, **options},
        idempotency_key=key,
        scheduled_at=SLOT,
        expires_at=SLOT + timedelta(seconds=30),
    )


def libpq(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[str]:
    """A new database with the manager's schema and procrastinate's."""
    async with new_pg_database() as url:
        await upgrade(url)
        await asyncio.to_thread(procrastinate, url, tmp_path / "out", "schema", "--apply")
        yield url


@pytest.fixture
async def target(db: str) -> AsyncIterator[ProcrastinateTarget]:
    t = ProcrastinateTarget.from_url(db)
    yield t
    await t.close()


async def jobs(url: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(libpq(url))
    try:
        return list(
            await conn.fetch(
                "SELECT id, queue_name, task_name, args::text AS args, status::text AS status, "
                "lock, queueing_lock FROM procrastinate_jobs ORDER BY id"
            )
        )
    finally:
        await conn.close()


async def test_slot_of_n_tasks_runs_once_each_in_a_real_worker(
    db: str, target: ProcrastinateTarget, tmp_path: Path
) -> None:
    tasks = [make_task(f"s{i}", {"n": i, "tag": "x"}) for i in range(5)]
    tasks.append(make_task("nothing", None, queue="other"))
    results = await target.enqueue(tasks, SLOT)
    assert [r.status for r in results] == ["enqueued"] * 6
    rows = await jobs(db)
    assert len(rows) == 6
    by_id = {str(r["id"]): r for r in rows}
    assert {r.message_id for r in results} == set(by_id)
    for result in results:
        row = by_id[result.message_id]  # type: ignore[index]
        assert row["task_name"] == "record"
        assert row["queue_name"] == result.task.queue
        assert json.loads(row["args"]) == (result.task.payload or {})
        assert row["lock"] is None and row["queueing_lock"] is None
        assert row["status"] == "todo"

    out = tmp_path / "out"
    await asyncio.to_thread(procrastinate, db, out, "worker", "--one-shot", "--no-listen-notify")
    received = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(str(e["id"]) for e in received) == sorted(by_id)  # each job once
    for entry in received:
        result = next(r for r in results if r.message_id == str(entry["id"]))
        assert entry["kwargs"] == (result.task.payload or {})
        assert entry["queue"] == result.task.queue
    assert {r["status"] for r in await jobs(db)} == {"succeeded"}


async def test_a_slot_sent_twice_inserts_one_job(db: str, target: ProcrastinateTarget) -> None:
    task = make_task("twice", {"a": 1})
    first = await target.enqueue([task], SLOT)
    again = await target.enqueue([task, task], SLOT)
    assert first[0].status == "enqueued"
    assert [r.status for r in again] == ["duplicate", "duplicate"]
    assert again[0].message_id == first[0].message_id
    assert len(await jobs(db)) == 1


async def test_a_key_repeated_within_a_batch_is_one_job(
    db: str, target: ProcrastinateTarget
) -> None:
    task = make_task("repeated", {"a": 1})
    results = await target.enqueue([task, task], SLOT)
    assert [r.status for r in results] == ["enqueued", "duplicate"]
    assert results[0].message_id == results[1].message_id
    assert len(await jobs(db)) == 1


async def test_managers_sending_the_same_slot_concurrently_insert_one_job(db: str) -> None:
    targets = [ProcrastinateTarget.from_url(db) for _ in range(6)]
    try:
        tasks = [make_task(f"race{i}", {"i": i}) for i in range(20)]
        batches = await asyncio.gather(
            *(t.enqueue(tasks[::-1] if n % 2 else tasks, SLOT) for n, t in enumerate(targets))
        )
    finally:
        for t in targets:
            await t.close()
    enqueued = [r for batch in batches for r in batch if r.status == "enqueued"]
    assert len(enqueued) == 20
    assert {r.task.idempotency_key for r in enqueued} == {t.idempotency_key for t in tasks}
    assert all(r.status in ("enqueued", "duplicate") for batch in batches for r in batch)
    assert len(await jobs(db)) == 20


async def test_a_payload_that_is_not_an_object_fails_its_task_alone(
    db: str, target: ProcrastinateTarget
) -> None:
    tasks = [
        make_task("list", [1, 2]),
        make_task("ok", {"k": "v"}),
        make_task("text", "hello"),
        make_task("long", {}, task_type="t" * 129),
    ]
    results = await target.enqueue(tasks, SLOT)
    assert [r.status for r in results] == ["failed", "enqueued", "failed", "failed"]
    assert "must be a JSON object of keyword arguments or null, not list" in str(results[0].error)
    assert "not str" in str(results[2].error)
    assert "longer than 128" in str(results[3].error)
    assert [r["task_name"] for r in await jobs(db)] == ["record"]


async def test_expired_keys_are_pruned_each_schedules_newest_kept(
    db: str, target: ProcrastinateTarget
) -> None:
    await target.enqueue([slot_task("s", 1), slot_task("s", 2), slot_task("other", 1)], SLOT)
    later = SLOT + timedelta(minutes=5)  # past every key's expires_at
    await target.enqueue([slot_task("s", 5)], later)
    conn = await asyncpg.connect(libpq(db))
    try:
        keys = await conn.fetch(
            "SELECT name, idempotency_key FROM pm_procrastinate_sent ORDER BY job_id"
        )
    finally:
        await conn.close()
    assert [k["idempotency_key"] for k in keys] == [
        slot_task("other", 1).idempotency_key,
        slot_task("s", 5).idempotency_key,
    ]
    assert len(await jobs(db)) == 4  # procrastinate's jobs are procrastinate's to delete


async def test_ping_needs_procrastinate_schema(db: str, target: ProcrastinateTarget) -> None:
    await target.ping()
    async with new_pg_database() as bare:
        other = ProcrastinateTarget.from_url(bare)
        try:
            with pytest.raises(Exception, match="procrastinate_jobs"):
                await other.ping()
        finally:
            await other.close()


async def test_a_database_without_procrastinate_fails_the_batch(db: str) -> None:
    async with new_pg_database() as bare:
        await upgrade(bare)
        other = ProcrastinateTarget.from_url(bare)
        try:
            with pytest.raises(TargetError, match="^procrastinate: .*procrastinate_jobs"):
                await other.enqueue([make_task("x", {})], SLOT)
        finally:
            await other.close()


def test_sqlite_is_refused_at_start_in_one_line() -> None:
    with pytest.raises(ValidationError) as info:
        Settings(target="procrastinate", database_url="sqlite+aiosqlite:///x.db", _env_file=None)
    assert "the procrastinate target needs PostgreSQL (procrastinate is PostgreSQL only)" in str(
        info.value
    )
    with pytest.raises(ValidationError, match="PostgreSQL only"):
        Settings(targets=("procrastinate",), database_url="sqlite:///x.db", _env_file=None)
    engine = create_engine("sqlite+aiosqlite:///x.db")
    try:
        with pytest.raises(TargetError, match="needs PostgreSQL"):
            ProcrastinateTarget(engine)
    finally:
        engine.sync_engine.dispose()


def test_settings_build_and_describe_the_target() -> None:
    url = "postgresql://pm:secret@db.example/pm"
    settings = Settings(target="procrastinate", database_url=url, _env_file=None)
    engine = create_engine(normalize_url(url))
    try:
        target = build_target(settings, engine)
        assert isinstance(target, ProcrastinateTarget)
    finally:
        engine.sync_engine.dispose()
    line = describe_targets(settings)
    assert "procrastinate (procrastinate_jobs in" in line and "secret" not in line
    assert "procrastinate" not in settings.configured_targets().no_completion  # overlap: yes


# -- options.overlap skip and hold: procrastinate_jobs.status --------------------------------------


def slot_task(name: str, n: int, **options: Any) -> Task:
    """Slot ``n`` (minutes after SLOT) of schedule ``name``."""
    at = SLOT + timedelta(minutes=n)
    key = f"{name}:{at.isoformat()}"
    return Task(
        id=task_id_for(key),
        name=name,
        task_type="record",
        payload={"n": n},
        queue="default",
        options={"queue": "default", **options},
        idempotency_key=key,
        scheduled_at=at,
        expires_at=at + timedelta(seconds=30),
    )


async def sql(url: str, statement: str, *args: Any) -> None:
    conn = await asyncpg.connect(libpq(url))
    try:
        await conn.execute(statement, *args)
    finally:
        await conn.close()


def outcome(results: list[Any]) -> list[tuple[str, str | None, bool | None]]:
    return [
        (
            r.status,
            r.previous.state if r.previous else None,
            r.previous.timed_out if r.previous else None,
        )
        for r in results
    ]


def job_id(result: Any) -> int:
    return int(result.message_id)


async def test_hold_follows_the_status_of_the_schedules_newest_job(
    db: str, target: ProcrastinateTarget, tmp_path: Path
) -> None:
    hold = {"overlap": "hold"}
    [first] = await target.enqueue([slot_task("n", 1, **hold)], SLOT)
    assert outcome([first]) == [("enqueued", "none", False)]
    busy = await target.enqueue([slot_task("n", 2, **hold), slot_task("plain", 2)], SLOT)
    assert outcome(busy) == [("busy", "queued", False), ("enqueued", None, None)]
    assert busy[0].previous.task_id == first.task.id  # type: ignore[union-attr]
    await sql(db, "UPDATE procrastinate_jobs SET status = 'doing' WHERE id = $1", job_id(first))
    assert outcome(await target.enqueue([slot_task("n", 2, **hold)], SLOT)) == [
        ("busy", "running", False)
    ]
    await sql(db, "UPDATE procrastinate_jobs SET status = 'todo' WHERE id = $1", job_id(first))
    # A real worker runs the job: finished.
    out = tmp_path / "out"
    await asyncio.to_thread(procrastinate, db, out, "worker", "--one-shot", "--no-listen-notify")
    [sent] = await target.enqueue([slot_task("n", 2, **hold)], SLOT)
    assert outcome([sent]) == [("enqueued", "finished", False)]
    again = await target.enqueue([slot_task("n", 2, **hold)], SLOT)
    assert [r.status for r in again] == ["duplicate"] and again[0].message_id == sent.message_id
    # A failed job is finished; so is a job whose row was deleted (procrastinate --delete-jobs).
    await sql(db, "UPDATE procrastinate_jobs SET status = 'failed' WHERE id = $1", job_id(sent))
    [third] = await target.enqueue([slot_task("n", 3, **hold)], SLOT)
    assert outcome([third]) == [("enqueued", "finished", False)]
    await sql(db, "DELETE FROM procrastinate_jobs WHERE id = $1", job_id(third))
    assert outcome(await target.enqueue([slot_task("n", 4, **hold)], SLOT)) == [
        ("enqueued", "finished", False)
    ]


async def test_overlap_timeout(db: str, target: ProcrastinateTarget) -> None:
    opts = {"overlap": "skip", "overlap_timeout": 90}
    await target.enqueue([slot_task("n", 1, **opts)], SLOT)
    later = SLOT + timedelta(seconds=60)  # past the key's expires_at (kept: the newest)
    assert outcome(await target.enqueue([slot_task("n", 2, **opts)], later)) == [
        ("busy", "queued", False)
    ]
    late = SLOT + timedelta(seconds=91)
    assert outcome(await target.enqueue([slot_task("n", 3, **opts)], late)) == [
        ("enqueued", "queued", True)
    ]


async def test_concurrent_managers_never_both_find_a_schedule_free(db: str) -> None:
    targets = [ProcrastinateTarget.from_url(db) for _ in range(6)]
    try:
        replies = await asyncio.gather(
            *(
                t.enqueue([slot_task("race", n, overlap="hold")], SLOT)
                for n, t in enumerate(targets)
            )
        )
    finally:
        for t in targets:
            await t.close()
    assert sorted(r[0].status for r in replies) == ["busy"] * 5 + ["enqueued"]
    assert len(await jobs(db)) == 1
