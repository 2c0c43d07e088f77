"""Ids are never handed out twice, on either backend: a deleted schedule's id, a deleted outbox
row's ``seq`` (its message id) and a deleted run's id stay retired, whoever deleted them (the API,
plain SQL, an import's ``--prune``), and across the 0007 upgrade that brought AUTOINCREMENT to
SQLite (an id deleted before it is not reused either)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import upgrade
from periodic_manager.db.models import metadata
from periodic_manager.schedules import files as sio
from periodic_manager.schedules import import_export
from tests.support import rawsql
from tests.support.e2e import Rig, at, e2e_rig

REBUILT = ("periodic_jobs", "pm_outbox", "pm_runs")
KEYS = {"periodic_jobs": "id", "pm_outbox": "seq", "pm_runs": "id"}


@pytest.fixture
async def rig(db_url: str, redis_prefix: str, redis_url: str) -> AsyncIterator[Rig]:
    """API and an in-process manager on the outbox target, on each backend."""
    async for r in e2e_rig(db_url, "outbox", redis_prefix, redis_url):
        yield r


async def _ids(engine: AsyncEngine, table: str = "periodic_jobs") -> list[int]:
    async with engine.connect() as conn:
        key = KEYS[table]
        return list(
            (await conn.execute(text(f"SELECT {key} FROM {table} ORDER BY {key}"))).scalars()
        )


async def test_a_deleted_id_is_never_handed_out_again_whoever_writes(rig: Rig) -> None:
    used: set[int] = set()

    def fresh(new_id: int) -> None:
        # Every new id is above every id ever used, not just above the ones still there.
        assert new_id > max(used, default=0), (new_id, sorted(used))
        used.add(new_id)

    async def post(name: str) -> int:
        r = await rig.client.post(
            "/schedules", json={"name": name, "spec": "* * * * *", "task_type": "t"}
        )
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    for name in ("a", "b", "c"):
        fresh(await post(name))
    await rig.advance_to(at(12, 2, 30))  # the manager fires them: outbox rows and run history
    assert set(await rig.slots("c")) == {"2024-05-01T12:01:00Z", "2024-05-01T12:02:00Z"}

    # The newest schedule is deleted (through the API), then another is created: SQLite used
    # to hand the deleted id out again.
    assert (await rig.client.delete(f"/schedules/{max(used)}")).status_code == 204
    fresh(await post("d"))
    # Deleted with SQL, created with SQL.
    await rawsql.execute(
        rig.settings.database_url, f"DELETE FROM periodic_jobs WHERE id = {max(used)}"
    )
    fresh(await rawsql.insert(rig.settings.database_url, "e"))
    # Deleted by an import's --prune, created by an import.
    plan = await import_export.plan(
        rig.engine, sio.validate([{"name": "f", "spec": "@daily", "task_type": "t"}]), True
    )
    assert plan.delete_ids and max(used) in plan.delete_ids
    await import_export.apply(rig.engine, plan, rig.clock.now())
    [f_id] = await _ids(rig.engine)
    fresh(f_id)
    # And the API again, while the manager keeps firing (its own writes go to other tables).
    await rig.advance_to(at(12, 4, 30))
    assert (await rig.client.delete(f"/schedules/{f_id}")).status_code == 204
    fresh(await post("g"))
    r = await rig.client.get(f"/schedules/{f_id}")
    assert r.status_code == 404  # a bookmark of the deleted schedule finds nothing, not "g"


async def test_outbox_seq_and_run_ids_are_never_reused(rig: Rig) -> None:
    r = await rig.client.post(
        "/schedules", json={"name": "x", "spec": "* * * * *", "task_type": "t"}
    )
    sid = r.json()["id"]
    await rig.advance_to(at(12, 2, 30))
    before = {table: await _ids(rig.engine, table) for table in ("pm_outbox", "pm_runs")}
    for table, ids in before.items():
        assert len(ids) == 2, (table, ids)
        # A consumer that deletes what it handled (or the run history's pruning) removes the
        # newest rows: their numbers must not come back (a consumer may keep the last seq it saw,
        # and the run history names outbox messages by seq).
        await rawsql.execute(
            rig.settings.database_url, f"DELETE FROM {table} WHERE {KEYS[table]} = {max(ids)}"
        )
    await rig.advance_to(at(12, 3, 30))  # the 12:03 slot: a new outbox row and a new run
    for table, ids in before.items():
        after = await _ids(rig.engine, table)
        assert len(after) == 2 and after[-1] > max(ids), (table, ids, after)
    outbox = await _ids(rig.engine, "pm_outbox")
    runs = await rig.client.get(f"/schedules/{sid}/runs")
    message_ids = [item["message_id"] for item in runs.json()["items"]]
    # The 12:03 task is not the deleted 12:02 one: its message id is a new seq.
    assert outbox[-1] > 2 and str(outbox[-1]) in message_ids, (outbox, message_ids)
    assert len(set(message_ids)) == len(message_ids)


async def test_postgresql_ids_come_from_sequences(pg_url: str) -> None:
    await upgrade(pg_url)
    engine = create_engine(pg_url)
    try:
        async with engine.connect() as conn:
            for table, key in KEYS.items():
                seq = (
                    await conn.execute(text(f"SELECT pg_get_serial_sequence('{table}', '{key}')"))
                ).scalar()
                assert seq is not None, f"{table}.{key} has no sequence"
    finally:
        await engine.dispose()


def _sqlite(path: str, sql: str) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(path)) as db:
        rows = db.execute(sql).fetchall()
        db.commit()
    return rows


def _schema(path: str) -> list[tuple[object, ...]]:
    return _sqlite(
        path,
        "SELECT type, name, sql FROM sqlite_master WHERE tbl_name IN"
        " ('periodic_jobs', 'pm_outbox', 'pm_runs') AND type IN ('index', 'trigger') ORDER BY name",
    )


def _raw_rows(path: str, table: str) -> list[tuple[object, ...]]:
    """Every column of every row as stored: storage class and bytes."""
    cols = [r[1] for r in _sqlite(path, f"PRAGMA table_info({table})")]
    listed = ", ".join(f"typeof({c}), CAST({c} AS BLOB)" for c in cols)
    return _sqlite(path, f"SELECT {listed} FROM {table} ORDER BY rowid")


async def test_sqlite_upgrade_keeps_rows_indexes_and_triggers_and_retires_deleted_ids(
    sqlite_url: str,
) -> None:
    path = sqlite_url.split(":///", 1)[1]
    await upgrade(sqlite_url, "0006_settled_slots")
    for i in range(4):
        await rawsql.insert(sqlite_url, f"job.{i}")
    for case in rawsql.cases("sqlite"):  # rows no manager can use are copied byte for byte too
        await rawsql.insert(
            sqlite_url, case.columns.get("name", f"'{case.label}'").strip("'"), **case.columns
        )
    top = await rawsql.insert(sqlite_url, "newest")
    await rawsql.execute(sqlite_url, f"DELETE FROM periodic_jobs WHERE id = {top}")
    await rawsql.execute(sqlite_url, "DELETE FROM periodic_jobs_deleted")  # its tombstone pruned
    # Outbox rows 1-3, the newest deleted by a consumer; the run history still names it.
    for n in (1, 2, 3):
        _sqlite(
            path,
            "INSERT INTO pm_outbox (task_id, idempotency_key, queue, name, task_type, payload,"
            f" options, scheduled_at, enqueued_at) VALUES ('t{n}', 'k{n}', 'default', 'job.0', 't',"
            " 'null', '{}', '2024-05-01 12:00:00', '2024-05-01 12:00:00')",
        )
        _sqlite(
            path,
            "INSERT INTO pm_runs (schedule_key, name, slot_at, status, at, lateness_ms, message_id)"
            f" VALUES ('1', 'job.0', '2024-05-01 12:0{n}:00', 'enqueued', '2024-05-01 12:0{n}:00',"
            f" 0, '{n}')",
        )
    _sqlite(
        path,
        "INSERT INTO pm_runs (schedule_key, name, slot_at, status, at, lateness_ms,"
        " message_id) VALUES ('1', 'job.0', '2024-05-01 12:05:00', 'enqueued',"
        " '2024-05-01 12:05:00', 0, '1733000000000-0')",
    )  # a Redis stream id: no seq
    _sqlite(path, "DELETE FROM pm_outbox WHERE seq = 3")
    schema, rows = _schema(path), {t: _raw_rows(path, t) for t in REBUILT}
    revision = _sqlite(path, "SELECT value FROM pm_revision")

    await upgrade(sqlite_url, "0007_ids_last_good")  # the rebuild, without what later ones add

    assert _schema(path) == schema  # every index and trigger, as it was
    assert {t: _raw_rows(path, t) for t in REBUILT} == rows  # every row, byte for byte
    assert _sqlite(path, "SELECT value FROM pm_revision") == revision
    for table in REBUILT:
        [(sql,)] = _sqlite(path, f"SELECT sql FROM sqlite_master WHERE name = '{table}'")
        assert "AUTOINCREMENT" in str(sql), sql
    # The deleted ids are retired: the next ones are above them.
    assert await rawsql.insert(sqlite_url, "after.upgrade") > top
    [(seq,)] = _sqlite(
        path,
        "INSERT INTO pm_outbox (task_id, idempotency_key, queue, name, task_type, payload, options,"
        " scheduled_at, enqueued_at) VALUES ('t4', 'k4', 'default', 'job.0', 't', 'null', '{}',"
        " '2024-05-01 12:04:00', '2024-05-01 12:04:00') RETURNING seq",
    )
    assert seq == 4  # above the deleted 3, and not thrown off by the stream id
    # The triggers of 0003 and 0004 work on the new table: revision, effective_at, tombstone.
    [(rev, effective)] = _sqlite(
        path, "SELECT revision, effective_at FROM periodic_jobs WHERE name = 'after.upgrade'"
    )
    assert rev > revision[0][0] and effective is not None
    _sqlite(path, "UPDATE periodic_jobs SET spec = '@daily' WHERE name = 'job.0'")
    [(rev2, touched)] = _sqlite(
        path, "SELECT revision, updated_at > created_at FROM periodic_jobs WHERE name = 'job.0'"
    )
    assert rev2 > rev and touched == 1
    _sqlite(path, "DELETE FROM periodic_jobs WHERE name = 'job.1'")
    assert _sqlite(path, "SELECT id FROM periodic_jobs_deleted") == [(2,)]


async def test_sqlite_tables_are_autoincrement_exactly_where_the_models_say(
    sqlite_url: str,
) -> None:
    await upgrade(sqlite_url)
    path = sqlite_url.split(":///", 1)[1]
    for table in metadata.sorted_tables:
        [(sql,)] = _sqlite(path, f"SELECT sql FROM sqlite_master WHERE name = '{table.name}'")
        wanted = bool(table.dialect_options["sqlite"]["autoincrement"])
        assert ("AUTOINCREMENT" in str(sql)) == wanted, table.name
    assert {
        t.name for t in metadata.sorted_tables if t.dialect_options["sqlite"]["autoincrement"]
    } == {*REBUILT, "pm_schedule_changes", "pm_http_deliveries"}  # 0007 rebuilt three; the
    # tables of 0012 and 0028 are born so (a dead letter's id is never given again)


async def test_sqlite_rebuild_keeps_columns_and_views_added_by_hand(sqlite_url: str) -> None:
    """0007 rebuilds three tables on SQLite: a column an operator added (with its values, its
    default and an index on it) and a view over the table survive it."""
    path = sqlite_url.split(":///", 1)[1]
    await upgrade(sqlite_url, "0006_settled_slots")
    await rawsql.insert(sqlite_url, "job.a")
    _sqlite(path, "ALTER TABLE periodic_jobs ADD COLUMN team TEXT DEFAULT 'ops' NOT NULL")
    _sqlite(path, 'ALTER TABLE pm_runs ADD COLUMN "note ""quoted""" INT DEFAULT (1 + 2)')
    _sqlite(path, "CREATE INDEX ix_team ON periodic_jobs (team)")
    _sqlite(path, "UPDATE periodic_jobs SET team = 'billing' WHERE name = 'job.a'")
    _sqlite(path, "CREATE VIEW v_jobs AS SELECT name, team FROM periodic_jobs")
    _sqlite(path, "CREATE VIEW v_runs AS SELECT count(*) AS n FROM pm_runs")

    await upgrade(sqlite_url)

    assert _sqlite(path, "SELECT name, team FROM v_jobs") == [("job.a", "billing")]
    assert _sqlite(path, "SELECT n FROM v_runs") == [(0,)]
    await rawsql.insert(sqlite_url, "job.b")  # the column's default is kept
    assert _sqlite(path, "SELECT team FROM periodic_jobs WHERE name = 'job.b'") == [("ops",)]
    assert _sqlite(path, "SELECT name FROM sqlite_master WHERE name = 'ix_team'") == [("ix_team",)]
    cols = [r[1] for r in _sqlite(path, "PRAGMA table_info(pm_runs)")]
    assert 'note "quoted"' in cols
    _sqlite(
        path,
        "INSERT INTO pm_runs (schedule_key, name, slot_at, status, at, lateness_ms)"
        " VALUES ('1', 'n', '2024-05-01', 'enqueued', '2024-05-01', 0)",
    )
    assert _sqlite(path, 'SELECT "note ""quoted""" FROM pm_runs') == [(3,)]
    [(sql,)] = _sqlite(path, "SELECT sql FROM sqlite_master WHERE name = 'periodic_jobs'")
    assert "AUTOINCREMENT" in str(sql)
