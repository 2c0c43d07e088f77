"""One RuntimeStore contract, run against MemoryRuntimeStore and DatabaseRuntimeStore on
PostgreSQL and SQLite; then the database store's read helpers and its round trips."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.contracts import (
    EntryRecord,
    ManagerInfo,
    ManagerStatus,
    RunRecord,
    RuntimeStore,
    StateRecord,
)
from periodic_manager.db import schedule_writer, store_reads
from periodic_manager.db.engine import create_engine
from periodic_manager.db.managers import REAP_CHUNK, beat_ctes
from periodic_manager.db.migrate import upgrade
from periodic_manager.db.store import DatabaseRuntimeStore
from periodic_manager.errors import NotFoundError
from periodic_manager.runtime.memory_store import MemoryRuntimeStore
from tests.conftest import backend_url

T0 = datetime(2030, 1, 1, tzinfo=UTC)
EVER = datetime(1970, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def info(manager_id: str) -> ManagerInfo:
    return ManagerInfo(manager_id, hostname="host-a", pid=4242, version="0.1.0", started_at=at(0))


def status(heartbeat_s: float, **kw: Any) -> ManagerStatus:
    fields: dict[str, Any] = {
        "is_leader": True,
        "last_sync_at": None,
        "last_sync_error": None,
        "entry_count": 0,
    }
    fields.update(kw)
    return ManagerStatus(heartbeat_at=at(heartbeat_s), **fields)


def entry(entry_id: str, key: str = "1", **kw: Any) -> EntryRecord:
    fields: dict[str, Any] = {
        "name": f"job.{key}",
        "content_hash": "a" * 64,
        "status": "active",
        "registered_at": at(1),
        "spec": "*/5 * * * *",
        "timezone": "Europe/Berlin",
        "anchor": None,
        "task_type": "reports.build",
        "queue": "default",
        "last_error": None,
    }
    fields.update(kw)
    return EntryRecord(entry_id=entry_id, schedule_key=key, **fields)


def run(key: str, slot_s: float, status: Any, **kw: Any) -> RunRecord:
    fields: dict[str, Any] = {"name": f"job.{key}", "at": at(slot_s + 0.25)}
    fields.update(kw)
    return RunRecord(schedule_key=key, slot=at(slot_s), status=status, **fields)


@dataclass
class Harness:
    """A store plus a way to look inside it, the same for every implementation."""

    store: RuntimeStore
    engine: AsyncEngine | None = None

    async def managers(self) -> dict[str, tuple[ManagerInfo, ManagerStatus]]:
        if isinstance(self.store, MemoryRuntimeStore):
            return dict(self.store.managers)
        assert isinstance(self.store, DatabaseRuntimeStore)
        async with self.store.engine.connect() as conn:
            live = await store_reads.live_managers(conn, alive_after=EVER)
        return {m.info.manager_id: (m.info, m.status) for m in live}

    async def entries(self) -> dict[str, dict[str, EntryRecord]]:
        """Entries per manager; managers without entries are left out."""
        if isinstance(self.store, MemoryRuntimeStore):
            return {m: dict(es) for m, es in self.store.entries.items() if es}
        assert isinstance(self.store, DatabaseRuntimeStore)
        out: dict[str, dict[str, EntryRecord]] = {}
        async with self.store.engine.connect() as conn:
            entries = await store_reads.live_entries(conn, alive_after=EVER)
        for live in entries:
            out.setdefault(live.manager.info.manager_id, {})[live.entry.entry_id] = live.entry
        return out

    async def entry_rows(self) -> int:
        """Every stored entry, orphans included (to see that entries go with their manager)."""
        if isinstance(self.store, MemoryRuntimeStore):
            return sum(len(es) for es in self.store.entries.values())
        assert self.engine is not None
        async with self.engine.connect() as conn:
            return int((await conn.execute(text("SELECT count(*) FROM pm_entries"))).scalar_one())

    async def states(self, keys: list[str]) -> dict[str, StateRecord]:
        if isinstance(self.store, MemoryRuntimeStore):
            return {k: self.store.state[k] for k in keys if k in self.store.state}
        assert isinstance(self.store, DatabaseRuntimeStore)
        return await self.store.get_state(keys)

    async def state(self, key: str) -> StateRecord | None:
        return (await self.states([key])).get(key)


@asynccontextmanager
async def open_harness(url: str | None) -> AsyncIterator[Harness]:
    if url is None:
        yield Harness(MemoryRuntimeStore())
        return
    await upgrade(url)
    engine = create_engine(url)
    try:
        # The contract in the instants the caller gives (PostgreSQL's own clock: apart, below).
        yield Harness(DatabaseRuntimeStore(engine, server_clock=False), engine)
        assert engine.pool.checkedout() == 0, "a store method left a connection checked out"
    finally:
        await engine.dispose()


def _url_of(request: pytest.FixtureRequest, backend: str) -> str | None:
    # Called from sync fixtures on purpose: an async fixture cannot resolve the async
    # ``pg_url`` fixture on demand (pytest-asyncio 1.x runs it on a loop already running).
    if backend == "memory":
        return None
    return backend_url(request, backend)


@pytest.fixture(params=["memory", "postgresql", "sqlite", "mysql"])
def any_store_url(request: pytest.FixtureRequest) -> str | None:
    return _url_of(request, str(request.param))


@pytest.fixture(params=["postgresql", "sqlite", "mysql"])
def db_store_url(request: pytest.FixtureRequest) -> str | None:
    return _url_of(request, str(request.param))


@pytest.fixture
async def harness(any_store_url: str | None) -> AsyncIterator[Harness]:
    """Every RuntimeStore implementation."""
    async with open_harness(any_store_url) as h:
        yield h


@pytest.fixture
async def db_harness(db_store_url: str) -> AsyncIterator[Harness]:
    """The database store on each backend."""
    async with open_harness(db_store_url) as h:
        yield h


# -- the contract --------------------------------------------------------------------------------


async def test_register_heartbeat_and_reregister(harness: Harness) -> None:
    store = harness.store
    await store.register_manager(info("m1"), status(0))
    assert await harness.managers() == {"m1": (info("m1"), status(0))}

    beat = status(5, is_leader=False, last_sync_at=at(4), last_sync_error="db down", entry_count=2)
    await store.heartbeat("m1", beat)
    assert await harness.managers() == {"m1": (info("m1"), beat)}

    with pytest.raises(LookupError):
        await store.heartbeat("never-registered", status(6))

    # Registering again (a restart with the same id) replaces the row and forgets old entries.
    await store.apply_entries("m1", [entry("e1")], [])
    restarted = replace(info("m1"), pid=99, started_at=at(10))
    await store.register_manager(restarted, status(10))
    assert await harness.managers() == {"m1": (restarted, status(10))}
    assert await harness.entries() == {}


async def test_apply_entries_adds_replaces_and_removes(harness: Harness) -> None:
    store = harness.store
    await store.register_manager(info("m1"), status(0))
    await store.register_manager(info("m2"), status(0))
    e1, e2 = entry("1-aaa", "1"), entry("2-bbb", "2", anchor=at(-3600), queue="q2")
    failed = entry(
        "3-ccc",
        "3",
        status="error",
        name=None,
        spec=None,
        timezone=None,
        task_type=None,
        queue=None,
        last_error="spec: syntax",
    )
    await store.apply_entries("m1", [e1, e2, failed], [])
    await store.apply_entries("m2", [e1], [])
    assert await harness.entries() == {
        "m1": {"1-aaa": e1, "2-bbb": e2, "3-ccc": failed},
        "m2": {"1-aaa": e1},
    }

    changed = e1._replace(content_hash="b" * 64, spec="0 * * * *", registered_at=at(60))
    await store.apply_entries("m1", [changed], ["2-bbb", "no-such-entry"])
    await store.apply_entries("m1", [], [])
    # m2's entry with the same id is another manager's: untouched.
    assert await harness.entries() == {
        "m1": {"1-aaa": changed, "3-ccc": failed},
        "m2": {"1-aaa": e1},
    }

    await store.apply_entries("m1", [], ["1-aaa", "3-ccc"])
    assert await harness.entries() == {"m2": {"1-aaa": e1}}


async def test_record_runs_folds_counts_slots_and_errors(harness: Harness) -> None:
    store = harness.store
    await store.record_runs([])
    await store.record_runs([run("1", 60, "enqueued", message_id="m-60"), run("1", 120, "skipped")])
    s = await harness.state("1")
    assert s is not None
    assert s.counts == {"enqueued": 1, "skipped": 1}
    assert (s.last_slot_at, s.last_enqueued_at, s.last_message_id) == (at(60), at(60.25), "m-60")
    assert (s.last_status, s.last_error, s.name) == ("skipped", None, "job.1")

    await store.record_runs([run("1", 180, "failed", error="redis down")])
    s = await harness.state("1")
    assert s is not None and (s.last_status, s.last_error) == ("failed", "redis down")
    assert s.last_slot_at == at(60), "a failed run does not move the last slot"

    await store.record_runs([run("1", 30, "duplicate", message_id="m-30")])
    s = await harness.state("1")
    assert s is not None
    assert (s.last_slot_at, s.last_message_id) == (at(60), "m-60"), "slots only move forward"
    assert (s.last_status, s.last_error) == ("duplicate", None), "a success clears the error"

    # One batch across schedules, a skipped run after a failure keeps the failure's error.
    await store.record_runs(
        [
            run("1", 240, "duplicate", message_id="m-240"),
            run("2", 240, "failed", error="boom"),
            run("1", 300, "failed", error="timeout"),
            run("1", 360, "skipped"),
            run("2", 300, "enqueued", message_id="m2-300", name="job.2.renamed"),
        ]
    )
    s1, s2 = await harness.state("1"), await harness.state("2")
    assert s1 is not None and s2 is not None
    assert s1.counts == {"enqueued": 1, "skipped": 2, "failed": 2, "duplicate": 2}
    assert (s1.last_slot_at, s1.last_message_id) == (at(240), "m-240")
    assert (s1.last_status, s1.last_error) == ("skipped", "timeout")
    assert s2.counts == {"failed": 1, "enqueued": 1}
    assert (s2.name, s2.last_slot_at, s2.last_error) == ("job.2.renamed", at(300), None)

    # The same slot again (a retried batch) replaces the details, as StateRecord.fold does.
    await store.record_runs([run("1", 240, "enqueued", message_id="m-240b", at=at(250))])
    s = await harness.state("1")
    assert s is not None
    assert (s.last_slot_at, s.last_enqueued_at, s.last_message_id) == (at(240), at(250), "m-240b")
    assert await harness.state("never-ran") is None


async def test_record_runs_lands_on_written_out_states(harness: Harness) -> None:
    """Every status, older slots, a repeated slot, across batches: after each batch the state is
    the one written out here by hand (not computed with StateRecord.fold, which the memory store
    runs itself)."""
    store = harness.store
    await store.record_runs(
        [
            run("1", 120, "enqueued", message_id="a", at=at(121)),
            run("1", 60, "resent", message_id="b", at=at(130)),  # an older slot: details stay
        ]
    )
    assert await harness.state("1") == StateRecord(
        "1",
        "job.1",
        last_slot_at=at(120),
        last_done_at=at(120),
        last_enqueued_at=at(121),
        last_message_id="a",
        last_status="resent",
        last_error=None,
        counts={"enqueued": 1, "resent": 1},
    )
    await store.record_runs(
        [
            run("1", 180, "held"),  # neither sent nor settled
            run("1", 180, "failed", error="e1"),
            run("1", 240, "skipped"),  # settled, not sent: the failure's error stays
        ]
    )
    assert await harness.state("1") == StateRecord(
        "1",
        "job.1",
        last_slot_at=at(120),
        last_done_at=at(240),
        last_enqueued_at=at(121),
        last_message_id="a",
        last_status="skipped",
        last_error="e1",
        counts={"enqueued": 1, "resent": 1, "held": 1, "failed": 1, "skipped": 1},
    )
    await store.record_runs(
        [
            run("1", 120, "duplicate", message_id="c", at=at(300)),  # the same slot: replaced
            run("1", 90, "skipped", name="job.1.renamed"),  # older than the settled 240
        ]
    )
    assert await harness.state("1") == StateRecord(
        "1",
        "job.1.renamed",
        last_slot_at=at(120),
        last_done_at=at(240),
        last_enqueued_at=at(300),
        last_message_id="c",
        last_status="skipped",
        last_error=None,
        counts={"enqueued": 1, "resent": 1, "held": 1, "failed": 1, "skipped": 2, "duplicate": 1},
    )


async def test_the_database_store_records_runs_as_folding_one_by_one(db_harness: Harness) -> None:
    """Random runs in random batches: after every batch the state the database computed is where
    StateRecord.fold, run one by one in Python, ends. (Not run on the memory store: it is that
    fold, so the comparison could not fail there; the test above pins it with written values.)"""
    harness = db_harness
    rng = random.Random(20301)
    statuses = ["enqueued", "duplicate", "resent", "skipped", "failed", "held"]
    runs = [
        run(
            str(rng.randint(1, 3)),
            rng.randint(0, 6) * 60,  # few distinct slots: ties and older slots are common
            rng.choice(statuses),
            message_id=rng.choice([None, f"msg-{i}"]),
            error=f"err-{i}",
            at=at(i),
        )
        for i in range(150)
    ]
    expected: dict[str, StateRecord] = {}
    i = 0
    while i < len(runs):
        batch = runs[i : i + rng.randint(1, 6)]
        i += len(batch)
        await harness.store.record_runs(batch)
        for r in batch:
            expected.setdefault(r.schedule_key, StateRecord(r.schedule_key, r.name)).fold(r)
        assert await harness.states(list(expected)) == expected, f"after run {i}"


async def test_settled_slots_move_forward_with_every_final_outcome_and_only_those(
    harness: Harness,
) -> None:
    """What a takeover reads: the latest slot enqueued, found enqueued, re-published or skipped
    for good. A failed or held slot may still be sent by the next leader: not settled."""
    store = harness.store
    await store.record_runs(
        [run("1", 60, "enqueued"), run("2", 60, "resent"), run("3", 60, "held")]
    )
    await store.record_runs(
        [run("1", 120, "skipped"), run("2", 120, "failed"), run("3", 30, "skipped")]
    )
    await store.record_runs([run("1", 90, "duplicate"), run("3", 120, "held")])
    assert await store.settled_after(EVER) == {"1": at(120), "2": at(60), "3": at(30)}
    assert await store.settled_after(at(60)) == {"1": at(120)}
    s2 = await harness.state("2")
    assert s2 is not None and s2.counts == {"resent": 1, "failed": 1}
    assert s2.last_slot_at == at(60), "a re-published slot was sent"


async def test_reap_removes_dead_managers_and_their_entries(harness: Harness) -> None:
    store = harness.store
    await store.register_manager(info("dead"), status(0))
    await store.register_manager(info("alive"), status(0))
    await store.apply_entries("dead", [entry("1-a", "1"), entry("2-b", "2")], [])
    await store.apply_entries("alive", [entry("1-a", "1")], [])
    await store.heartbeat("alive", status(60))

    assert await store.reap(older_than=at(60)) == 1  # heartbeat exactly at the limit survives
    assert set(await harness.managers()) == {"alive"}
    assert await harness.entry_rows() == 1
    assert set(await harness.entries()) == {"alive"}
    assert await store.reap(older_than=at(60)) == 0


async def test_a_late_heartbeat_counts_the_others_due_never_itself(harness: Harness) -> None:
    # Its own row is older than reap_before until the beat lands (PostgreSQL does both in one
    # statement, on one snapshot): the beat must win. The heartbeat only counts the dead; the
    # reap that follows removes them (never inside a heartbeat: their entries may be many).
    store = harness.store
    await store.register_manager(info("late"), status(0))
    await store.register_manager(info("dead"), status(0))
    assert await store.heartbeat("late", status(100), reap_before=at(50)) == 1
    assert set(await harness.managers()) == {"late", "dead"}
    assert await store.heartbeat("late", status(100)) == 0  # no reap_before: nothing counted
    assert await store.reap(older_than=at(50)) == 1
    managers = await harness.managers()
    assert set(managers) == {"late"} and managers["late"][1].heartbeat_at == at(100)


async def test_a_reap_removes_a_dead_managers_many_entries_in_short_transactions(
    harness: Harness,
) -> None:
    """More entries than one reap transaction takes (REAP_CHUNK): all go, with the manager."""
    store = harness.store
    await store.register_manager(info("dead"), status(0))
    await store.register_manager(info("alive"), status(100))
    n = REAP_CHUNK * 2 + 7
    await store.apply_entries("dead", [entry(f"{k}-x", str(k)) for k in range(n)], [])
    await store.apply_entries("alive", [entry("1-a", "1")], [])
    assert await harness.entry_rows() == n + 1
    assert await store.reap(older_than=at(50)) == 1
    assert set(await harness.managers()) == {"alive"}
    assert await harness.entry_rows() == 1


async def test_unregister_removes_manager_and_entries(harness: Harness) -> None:
    store = harness.store
    await store.register_manager(info("m1"), status(0))
    await store.register_manager(info("m2"), status(0))
    await store.apply_entries("m1", [entry("1-a", "1")], [])
    await store.apply_entries("m2", [entry("2-b", "2")], [])
    await store.unregister_manager("m1")
    await store.unregister_manager("m1")  # twice, or never registered: nothing to do
    assert set(await harness.managers()) == {"m2"}
    assert await harness.entry_rows() == 1
    assert set(await harness.entries()) == {"m2"}


# -- the database store's read side (the API's) and costs ----------------------------------------


@pytest.fixture
def db_store(db_harness: Harness) -> DatabaseRuntimeStore:
    assert isinstance(db_harness.store, DatabaseRuntimeStore)
    return db_harness.store


async def test_list_entries_only_of_live_managers(db_store: DatabaseRuntimeStore) -> None:
    await db_store.register_manager(info("old"), status(0))
    await db_store.register_manager(info("new"), status(100, entry_count=2))
    await db_store.register_manager(info("empty"), status(100))
    e2, e1 = entry("2-b", "2"), entry("1-a", "1")
    await db_store.apply_entries("old", [e1], [])
    await db_store.apply_entries("new", [e2, e1], [])

    async with db_store.engine.connect() as conn:
        live = await store_reads.live_entries(conn, alive_after=at(50))
        assert [(x.manager.info.manager_id, x.entry) for x in live] == [("new", e1), ("new", e2)]
        assert all(isinstance(x, store_reads.LiveEntry) for x in live)
        assert live[0].manager.status == status(100, entry_count=2)
        assert live[0].manager.info == info("new")
        managers = await store_reads.live_managers(conn, alive_after=at(50))
        assert [m.info.manager_id for m in managers] == ["empty", "new"]
        assert len(await store_reads.live_entries(conn, alive_after=at(0))) == 3


async def test_every_field_of_an_entry_is_stored_in_its_column(
    db_store: DatabaseRuntimeStore,
) -> None:
    # PostgreSQL copies a record as the row it is: each field must land in its own column (a
    # field out of order lands in another column of the same type unnoticed by the driver).
    await db_store.register_manager(info("m1"), status(100))
    held = entry(
        "1-a",
        "1",
        anchor=at(-7),
        registered_at=at(2),
        held_slot=at(3),
        last_error="late",
        previous_task_id="t" * 200,
        previous_task_state="running",
        last_good_since=at(4),
    )
    blank = entry("2-b", "2", previous_task_id="", previous_task_state="finished")
    await db_store.apply_entries("m1", [held, blank], [])
    async with db_store.engine.connect() as conn:
        got = {x.entry.entry_id: x.entry for x in await store_reads.live_entries(conn, EVER)}
    # The task id is cut to the column's 128 characters, an empty one stored as none.
    assert got["1-a"] == held._replace(previous_task_id="t" * 128)
    assert got["2-b"] == blank._replace(previous_task_id=None)


async def test_live_entries_carry_their_schedules_state(db_store: DatabaseRuntimeStore) -> None:
    await db_store.register_manager(info("m1"), status(100))
    await db_store.apply_entries("m1", [entry("1-a", "1"), entry("2-b", "2")], [])
    await db_store.record_runs([run("1", 60, "enqueued")])
    async with db_store.engine.connect() as conn:
        live = await store_reads.live_entries(conn, alive_after=at(50))
        [one] = await store_reads.live_entries(conn, alive_after=at(50), schedule_key="1")
    assert [x.entry.schedule_key for x in live] == ["1", "2"]
    assert live[1].state is None
    assert one.state == (await db_store.get_state(["1"]))["1"]
    assert one.state is not None and one.state.last_slot_at == at(60)


async def test_get_state_and_the_writers_cascade(db_store: DatabaseRuntimeStore) -> None:
    await db_store.record_runs([run("1", 60, "enqueued"), run("2", 60, "skipped")])
    states = await db_store.get_state(["1", "2", "3", "1"])
    assert set(states) == {"1", "2"}
    assert states["2"].counts == {"skipped": 1}
    assert await db_store.get_state([]) == {}
    # A schedule's state goes with its row (the schedule writer deletes both).
    async with db_store.engine.begin() as conn:
        await schedule_writer.delete_rows(conn, [1])
    assert set(await db_store.get_state(["1", "2"])) == {"2"}


async def test_heartbeat_and_run_batches_are_one_statement(
    db_store: DatabaseRuntimeStore,
) -> None:
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    await db_store.register_manager(info("m1"), status(0))
    event.listen(db_store.engine.sync_engine, "before_cursor_execute", count)
    try:
        await db_store.heartbeat("m1", status(5))
        # PostgreSQL: the update and the reap in one statement sent by the driver itself (see
        # the round-trip test below).
        if db_store.engine.dialect.name == "postgresql":
            assert statements == []
        else:
            assert len(statements) == 1 and statements[0].lstrip().upper().startswith("UPDATE")
        statements.clear()
        await db_store.record_runs(
            [run(str(k), s * 60, "enqueued") for s in range(10) for k in range(50)]
        )
        # The state upsert, then the history rows: one COPY on PostgreSQL (below the SQL layer,
        # so not an executed statement here), one executemany into pm_runs on SQLite and MariaDB.
        postgres = db_store.engine.dialect.name == "postgresql"
        upsert = (
            "ON DUPLICATE KEY UPDATE" if db_store.engine.dialect.name == "mysql" else "ON CONFLICT"
        )
        assert len(statements) == (1 if postgres else 2) and upsert in statements[0].upper()
        if not postgres:
            assert statements[1].upper().startswith("INSERT INTO PM_RUNS")
    finally:
        event.remove(db_store.engine.sync_engine, "before_cursor_execute", count)
    s = (await db_store.get_state(["49"]))["49"]
    assert s.counts == {"enqueued": 10} and s.last_slot_at == at(540)
    async with db_store.engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM pm_runs"))).scalar() == 500


async def test_a_heartbeat_on_the_managers_engine_is_one_round_trip(pg_url: str) -> None:
    """The manager's engine (no pre-ping) and the PostgreSQL heartbeat (one statement, no
    transaction around it): a manager at rest beats every 5 s, so each round trip counts."""
    await upgrade(pg_url)
    engine = create_engine(pg_url, ping=False)
    sent: list[str] = []  # what the driver sends: statements, BEGIN, COMMIT, pings

    @event.listens_for(engine.sync_engine.pool, "connect")
    def log_queries(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.driver_connection.add_query_logger(lambda q: sent.append(q.query))

    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    store = DatabaseRuntimeStore(engine)
    try:
        await store.register_manager(info("m1"), status(0))
        await store.register_manager(info("dead"), status(0))
        async with engine.begin() as conn:  # silent for a minute on the database's clock
            await conn.execute(
                text(
                    "UPDATE pm_managers SET heartbeat_at = now() - interval '1 minute' WHERE manager_id = 'dead'"
                )
            )
        event.listen(engine.sync_engine, "before_cursor_execute", count)
        for beat in (5, 10):
            sent.clear()
            statements.clear()
            assert await store.heartbeat("m1", status(beat), reap_before=at(beat - 15)) == 1
            await asyncio.sleep(0)  # the driver calls its query loggers soon after each query
            assert (
                statements == [] and len(sent) == 1 and sent[0].startswith("WITH beat AS (UPDATE")
            )
        assert await store.reap(at(-100), silence=timedelta(seconds=15)) == 1  # apart from the beat
        assert set(await Harness(store).managers()) == {"m1"}
        with pytest.raises(NotFoundError):
            await store.heartbeat("dead", status(15), reap_before=at(12))
    finally:
        await engine.dispose()


@pytest.mark.parametrize("carried", [False, True], ids=["own-statement", "carried-by-a-round"])
async def test_liveness_is_judged_on_the_databases_clock_never_on_two_managers_clocks(
    pg_url: str, carried: bool
) -> None:
    """Two managers whose clocks are 30 s apart (their statuses' instants) beat on PostgreSQL:
    each beat is the server's now(), and neither counts nor reaps the other as dead (15 s
    apart they reaped each other alive, issue 36). One silent for longer than the silence on
    the server's clock is counted and reaped."""
    await upgrade(pg_url)
    engine = create_engine(pg_url)
    store = DatabaseRuntimeStore(engine)
    silence = timedelta(seconds=15)
    ahead, behind = status(30, clock_offset_s=30.0), status(-30)  # what each one's clock says
    try:
        for name, st in (("ahead", ahead), ("behind", behind), ("silent", status(0))):
            await store.register_manager(info(name), st)

        async def beat(name: str, st: ManagerStatus) -> int:
            if not carried:
                return await store.heartbeat(name, st, reap_before=st.heartbeat_at - silence)
            async with engine.connect() as conn:
                driver = (await conn.get_raw_connection()).driver_connection
                assert driver is not None
                values = store.beat_values(name, st, st.heartbeat_at - silence)
                row = await driver.fetchrow(
                    f"WITH {beat_ctes(1)} SELECT (SELECT * FROM due)", *values
                )
                return int(row[0])

        for _ in range(2):
            assert await beat("ahead", ahead) == 0 and await beat("behind", behind) == 0
        async with engine.begin() as conn:
            stamps = dict(
                (
                    await conn.execute(
                        text(
                            "SELECT manager_id, now() - heartbeat_at < interval '5 seconds' FROM pm_managers"
                        )
                    )
                ).all()
            )
            assert stamps == {"ahead": True, "behind": True, "silent": True}  # the server's now()
            await conn.execute(
                text(
                    "UPDATE pm_managers SET heartbeat_at = now() - interval '16 seconds' WHERE manager_id = 'silent'"
                )
            )
        assert await beat("ahead", ahead) == 1 and await beat("behind", behind) == 1
        assert await store.reap(behind.heartbeat_at - silence, silence=silence) == 1
        managers = await Harness(store).managers()
        assert set(managers) == {"ahead", "behind"}
        assert (
            managers["ahead"][1].clock_offset_s == 30.0
            and managers["behind"][1].clock_offset_s is None
        )
        async with engine.begin() as conn:  # a column like any: NaN reads as not measured
            await conn.execute(text("UPDATE pm_managers SET clock_offset_s = 'NaN'"))
        assert (await Harness(store).managers())["ahead"][1].clock_offset_s is None
    finally:
        await engine.dispose()


async def test_a_pooled_connection_the_server_closed_is_replaced_without_a_ping(
    pg_url: str,
) -> None:
    await upgrade(pg_url)
    engine = create_engine(pg_url, ping=False, pool_size=1, max_overflow=0)
    store = DatabaseRuntimeStore(engine)
    try:
        await store.register_manager(info("m1"), status(0))
        closed = asyncio.get_running_loop().create_future()
        async with engine.connect() as conn:
            pooled = (await conn.get_raw_connection()).driver_connection
            pooled.add_termination_listener(lambda _c: closed.done() or closed.set_result(None))
            pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar()
        killer = create_engine(pg_url)
        async with killer.connect() as other:
            await other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        await killer.dispose()
        async with asyncio.timeout(10):  # a bound: the loop reads the server's goodbye
            await closed
        assert pooled.is_closed()
        await store.heartbeat("m1", status(5))  # on a new connection, not the closed one
    finally:
        await engine.dispose()


async def test_sqlite_engine_enforces_foreign_keys(sqlite_url: str) -> None:
    # Entry cleanup relies on ON DELETE CASCADE, which SQLite honours only with this pragma,
    # set by create_engine on every connection.
    engine = create_engine(sqlite_url)
    try:
        async with engine.connect() as conn:
            assert (await conn.execute(text("PRAGMA foreign_keys"))).scalar_one() == 1
    finally:
        await engine.dispose()


async def test_runs_of_a_limited_schedule_count_each_slot_once(harness: Harness) -> None:
    """options.max_runs: a sent slot counts once, however often it is found duplicate (a
    takeover's re-send, a second manager), in one batch or across batches; skipped, failed
    and unlimited runs never count."""
    store = harness.store
    await store.record_runs([run("1", 10, "enqueued", limited=True), run("2", 10, "enqueued")])
    await store.record_runs(
        [
            run("1", 10, "duplicate", limited=True),  # found sent again: no new run
            run("1", 20, "enqueued", limited=True),
            run("1", 20, "duplicate", limited=True),
            run("1", 30, "skipped", limited=True),
            run("1", 40, "failed", limited=True),
        ]
    )
    await store.record_runs(
        [run("1", 20, "resent", limited=True), run("1", 50, "resent", limited=True)]
    )
    state = await store.get_state(["1", "2"])
    assert state["1"].runs == 3 and state["1"].last_done_at == at(50)  # slots 10, 20 and 50
    assert state["2"].runs == 0  # not limited
