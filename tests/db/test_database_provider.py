"""DatabaseProvider against real PostgreSQL and SQLite: rows written with plain SQL, as anyone
with database access would write them."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg
import pytest
from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.contracts import (
    ConfigProvider,
    DigestingProvider,
    PartitionsHeld,
    ProviderSnapshot,
)
from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import upgrade
from periodic_manager.db.models import jobs_table
from periodic_manager.db.provider import DatabaseProvider
from periodic_manager.db.provider_scope import EVERY_RUNS
from periodic_manager.errors import ProviderError
from periodic_manager.schedules.definition import PeriodicTaskConfig
from tests.conftest import backend_url


def streamed(engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQL of every read the providers stream from now on, compiled for ``engine``."""
    statements: list[str] = []
    stream = DatabaseProvider._stream

    def counted(self: DatabaseProvider, conn: Any, query: Any, params: Any = None) -> Any:
        statements.append(str(query.compile(dialect=engine.dialect)))
        return stream(self, conn, query, params)

    monkeypatch.setattr(DatabaseProvider, "_stream", counted)
    return statements


@pytest.fixture
def empty_db_url(backend: str, request: pytest.FixtureRequest) -> str:
    # Overrides conftest's async version, which cannot resolve the async ``pg_url`` fixture
    # from inside a running event loop (pytest-asyncio 1.x); a sync fixture can.
    return backend_url(request, backend)


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_engine(db_url)
    try:
        yield eng
        assert eng.pool.checkedout() == 0
    finally:
        await eng.dispose()


def _lit(value: Any, mysql: bool = False) -> str:
    """A SQL literal, so rows go in exactly as typed (no driver-side typing or JSON encoding).
    ``mysql``: MariaDB/MySQL read a backslash in a literal as an escape; it is doubled."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        if mysql:
            value = value.replace("\\", "\\\\")
        return "'" + value.replace("'", "''") + "'"
    return str(value)  # raw SQL such as X'FF'


class Raw(str):
    """A SQL expression inserted verbatim (e.g. a blob literal)."""


async def insert_row(engine: AsyncEngine, name: Any, **cols: Any) -> int:
    values: dict[str, Any] = {"name": name, "spec": "0 0 * * *", "task_type": "t", **cols}
    names = ", ".join(values)
    mysql = engine.dialect.name != "postgresql" and engine.dialect.name != "sqlite"
    lits = ", ".join(v if isinstance(v, Raw) else _lit(v, mysql) for v in values.values())
    async with engine.begin() as conn:
        await conn.execute(text(f"INSERT INTO periodic_jobs ({names}) VALUES ({lits})"))
        return int((await conn.execute(text("SELECT max(id) FROM periodic_jobs"))).scalar_one())


async def update_row(engine: AsyncEngine, row_id: int, **cols: Any) -> None:
    mysql = engine.dialect.name not in ("postgresql", "sqlite")
    sets = ", ".join(f"{k} = {_lit(v, mysql)}" for k, v in cols.items())
    async with engine.begin() as conn:
        await conn.execute(text(f"UPDATE periodic_jobs SET {sets} WHERE id = {row_id}"))


def test_provider_satisfies_protocol() -> None:
    def accepts(_p: ConfigProvider) -> None: ...

    accepts(DatabaseProvider.__new__(DatabaseProvider))
    # Its capabilities beyond get_configs, as the syncer checks them once.
    assert isinstance(DatabaseProvider.__new__(DatabaseProvider), DigestingProvider)


async def test_valid_rows_become_configs(engine: AsyncEngine) -> None:
    daily = await insert_row(
        engine,
        "reports.daily",
        spec="0 6 * * *",
        timezone="Europe/Berlin",
        task_type="reports.build",
        payload='{"b": [1, 2.5, null], "a": "ü"}',
        options='{"queue": "reports", "max_retry": 3, "timeout": 1.5, "extra": {"k": "v"}}',
        description="built every morning",
    )
    # MariaDB takes no offset in a literal (its DATETIME holds UTC).
    anchor = (
        "2024-01-01 00:00:00" if engine.dialect.name == "mysql" else "2024-01-01T02:00:00+02:00"
    )
    every = await insert_row(engine, "ticks", spec="@every 90s", anchor=anchor, payload="7")
    bare = await insert_row(engine, "bare")  # payload NULL, options by server default
    await insert_row(engine, "paused", enabled=False)

    snap = await DatabaseProvider(engine).get_configs()

    assert isinstance(snap, ProviderSnapshot)
    assert snap.errors == []
    assert snap.configs == [
        PeriodicTaskConfig.create(
            name="reports.daily",
            spec="0 6 * * *",
            timezone="Europe/Berlin",
            task_type="reports.build",
            payload={"a": "ü", "b": [1, 2.5, None]},
            options={"queue": "reports", "max_retry": 3, "timeout": 1.5, "extra": {"k": "v"}},
            schedule_id=daily,
        ),
        PeriodicTaskConfig.create(
            name="ticks",
            spec="@every 90s",
            task_type="t",
            payload=7,
            anchor=datetime(2024, 1, 1, tzinfo=UTC),
            schedule_id=every,
        ),
        PeriodicTaskConfig.create(name="bare", spec="0 0 * * *", task_type="t", schedule_id=bare),
    ]
    ticks = snap.configs[1]
    assert ticks.anchor is not None and ticks.anchor.tzinfo is UTC
    assert snap.configs[0].queue == "reports"
    assert snap.configs[2].options == {} and snap.configs[2].queue == "default"


# (name, columns, field named by the RowError); every backend can store these.
BAD_ROWS: list[tuple[str, dict[str, Any], str]] = [
    ("bad.spec", {"spec": "not a cron"}, "spec"),
    ("bad.zone", {"timezone": "Mars/Olympus"}, "timezone"),
    ("bad.options.array", {"options": "[1, 2]"}, "options"),
    ("bad.options.key", {"options": '{"queu": "x"}'}, "options.queu"),
    ("bad.options.value", {"options": '{"max_retry": -1}'}, "options.max_retry"),
    ("bad name!", {}, "name"),
    ("bad.newline\n", {}, "name"),  # a regex's $ would let a trailing newline through
    ("bad.queue", {"options": '{"queue": "q\\n"}'}, "options.queue"),
    ("bad.type", {"task_type": ""}, "task_type"),
    # Valid JSON to the database, but beyond what Python's json will read (digit limit).
    ("bad.payload.huge", {"payload": "1" + "0" * 5000}, "payload"),
]
# Only SQLite lets a row hold these: its columns accept any value of any type.
SQLITE_BAD_ROWS: list[tuple[str, dict[str, Any], str]] = [
    ("bad.payload.text", {"payload": "not json {"}, "payload"),
    ("bad.options.text", {"options": "queue=x"}, "options"),
    ("bad.anchor.text", {"anchor": "yesterday"}, "anchor"),
    ("bad.anchor.number", {"anchor": Raw("1700000000")}, "anchor"),
    ("bad.spec.blob", {"spec": Raw("X'FFFE'")}, "spec"),
    ("bad.zone.number", {"timezone": Raw("42")}, "timezone"),
]


# What MariaDB/MySQL let a row hold: JSON columns are LONGTEXT, DATETIME takes a zero date and
# the years beyond what a schedule may use, a boolean is a TINYINT.
MYSQL_BAD_ROWS: list[tuple[str, dict[str, Any], str]] = [
    ("bad.payload.text", {"payload": "not json {"}, "payload"),
    ("bad.options.text", {"options": "queue=x"}, "options"),
    ("bad.anchor.zero", {"anchor": "0000-00-00 00:00:00"}, "anchor"),
    ("bad.anchor.zero.day", {"anchor": "2024-00-00 00:00:00"}, "anchor"),
    ("bad.anchor.9999", {"anchor": "9999-12-31 23:59:59.999999"}, "anchor"),
    ("bad.anchor.year.1", {"anchor": "0001-01-01 00:00:00"}, "anchor"),
    ("bad.enabled.2", {"enabled": Raw("2")}, "enabled"),
    ("bad.enabled.minus", {"enabled": Raw("-1")}, "enabled"),
]
EXTRA_BAD_ROWS = {"sqlite": SQLITE_BAD_ROWS, "mysql": MYSQL_BAD_ROWS}


async def test_each_bad_row_is_reported_and_the_others_are_returned(
    engine: AsyncEngine, backend: str
) -> None:
    cases = BAD_ROWS + EXTRA_BAD_ROWS.get(backend, [])
    good_before = await insert_row(engine, "good.before")
    ids = {name: await insert_row(engine, name, **cols) for name, cols, _ in cases}
    good_after = await insert_row(engine, "good.after", spec="@every 30s")
    await insert_row(engine, "bad.but.paused", spec="nonsense", enabled=False)
    if backend == "sqlite":
        # A name that is not UTF-8 text: the row is still reported, its name shown lossily.
        blob_id = await insert_row(engine, Raw("X'FF00'"))

    snap = await DatabaseProvider(engine).get_configs()

    assert [(c.name, c.schedule_id) for c in snap.configs] == [
        ("good.before", good_before),
        ("good.after", good_after),
    ]
    by_id = {e.schedule_id: e for e in snap.errors}
    for name, _, field in cases:
        err = by_id.pop(ids[name])
        assert (err.name, err.field) == (name, field), err
        assert err.reason and len(err.content_hash) == 64
    if backend == "sqlite":
        err = by_id.pop(blob_id)
        assert (err.name, err.field) == ("\ufffd\x00", "name")
    assert by_id == {}, "unexpected errors (a paused row must not be reported)"
    assert len({e.content_hash for e in snap.errors}) == len(snap.errors)


async def test_raw_content_hash_follows_the_bad_row(engine: AsyncEngine) -> None:
    provider = DatabaseProvider(engine)
    row = await insert_row(engine, "broken", spec="bad one")

    async def error_hash() -> str:
        snap = await provider.get_configs()
        [err] = snap.errors
        assert err.schedule_id == row
        return err.content_hash

    first = await error_hash()
    assert await error_hash() == first  # same content: same hash, so it is logged once
    await update_row(engine, row, description="a note the provider does not read")
    assert await error_hash() == first
    await update_row(engine, row, spec="bad two")
    second = await error_hash()
    assert second != first
    await update_row(engine, row, options='{"queue": "q"}')
    assert await error_hash() not in (first, second)
    await update_row(engine, row, spec="0 * * * *")
    snap = await provider.get_configs()
    assert snap.errors == [] and [c.schedule_id for c in snap.configs] == [row]


async def _assert_provider_error(url: str) -> None:
    eng = create_engine(url, command_timeout=5)
    try:
        with pytest.raises(ProviderError) as info:
            await DatabaseProvider(eng).get_configs()
        assert info.value.__cause__ is not None
        assert eng.pool.checkedout() == 0
    finally:
        await eng.dispose()


async def test_unreachable_server_raises_provider_error() -> None:
    await _assert_provider_error("postgresql+asyncpg://postgres@127.0.0.1:1/nowhere")


async def test_missing_database_raises_provider_error(pg_url: str) -> None:
    server = pg_url.rsplit("/", 1)[0]
    await _assert_provider_error(f"{server}/pm_missing_{uuid.uuid4().hex[:12]}")


async def test_missing_table_raises_provider_error(empty_db_url: str) -> None:
    await _assert_provider_error(empty_db_url)


async def test_dropped_database_raises_provider_error(pg_url: str) -> None:

    eng = create_engine(pg_url)
    try:
        provider = DatabaseProvider(eng)
        with pytest.raises(ProviderError):
            await provider.get_configs()  # reachable, but not migrated
        server, name = pg_url.replace("+asyncpg", "").rsplit("/", 1)
        admin = await asyncpg.connect(f"{server}/postgres", timeout=5)
        try:
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        finally:
            await admin.close()
        with pytest.raises(ProviderError):
            await provider.get_configs()  # the pooled connection is dead, reconnecting fails
        assert eng.pool.checkedout() == 0
    finally:
        await eng.dispose()


async def test_sqlite_anchor_as_written_by_sqlalchemy_or_by_hand(sqlite_url: str) -> None:
    """SQLite has no zone-aware type: SQLAlchemy stores naive UTC text, so text without an
    offset is UTC, and text with an offset (typed by hand) is converted."""
    await upgrade(sqlite_url)
    eng = create_engine(sqlite_url)
    try:
        async with eng.begin() as conn:
            await conn.execute(
                insert(jobs_table).values(
                    name="orm",
                    spec="@every 60s",
                    task_type="t",
                    anchor=datetime(
                        2024, 5, 1, 12, 30, 15, 250000, tzinfo=ZoneInfo("Europe/Berlin")
                    ),
                )
            )
        await insert_row(eng, "naive", spec="@every 60s", anchor="2024-05-01 10:30:15")
        await insert_row(eng, "offset", spec="@every 60s", anchor="2024-05-01T12:30:15+02:00")
        snap = await DatabaseProvider(eng).get_configs()
        assert snap.errors == []
        assert {c.name: c.anchor for c in snap.configs} == {
            "orm": datetime(2024, 5, 1, 10, 30, 15, 250000, tzinfo=UTC),
            "naive": datetime(2024, 5, 1, 10, 30, 15, tzinfo=UTC),
            "offset": datetime(2024, 5, 1, 10, 30, 15, tzinfo=UTC),
        }
        assert all(c.anchor is not None and c.anchor.tzinfo is UTC for c in snap.configs)
    finally:
        await eng.dispose()


async def test_a_payload_column_altered_to_text_under_a_running_provider_is_noticed(
    pg_url: str,
) -> None:
    """A jsonb payload column is trusted to hold valid JSON; once an operator alters it to text
    (where anything goes), the next read parses payloads again and an invalid one is a row error."""
    await upgrade(pg_url)
    eng = create_engine(pg_url)
    try:
        provider = DatabaseProvider(eng)
        await insert_row(eng, "good", payload='{"n": 1}')
        snapshot = await provider.get_configs()
        assert [c.name for c in snapshot.configs] == ["good"] and not snapshot.errors
        async with eng.begin() as conn:
            await conn.execute(text("ALTER TABLE periodic_jobs ALTER COLUMN payload TYPE text"))
        await insert_row(eng, "broken", payload="{not json}")
        changes = await provider.get_changes(snapshot.revision)
        assert changes is not None and not changes.configs
        assert [e.field for e in changes.errors] == ["payload"]
        full = await provider.get_configs()
        assert [c.name for c in full.configs] == ["good"]
        assert [e.field for e in full.errors] == ["payload"]
    finally:
        await eng.dispose()


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_a_provider_restricted_to_partitions_reads_only_their_rows(
    engine: AsyncEngine,
) -> None:
    ids = [await insert_row(engine, f"p{i}") for i in range(8)]
    held = frozenset({1, 3})
    provider = DatabaseProvider(engine)
    provider.restrict(lambda: PartitionsHeld(4, held))
    snapshot = await provider.get_configs()
    assert sorted(c.schedule_id for c in snapshot.configs) == [i for i in ids if i % 4 in held]
    # A change to a row of a partition not held is not read; one of a held partition is.
    other = next(i for i in ids if i % 4 == 0)
    mine = next(i for i in ids if i % 4 == 1)
    await update_row(engine, other, payload='{"v": 1}')
    await update_row(engine, mine, payload='{"v": 2}')
    changes = await provider.get_changes(snapshot.revision)
    assert changes is not None and [c.schedule_id for c in changes.configs] == [mine]
    taken = await provider.get_partitions(frozenset({1}))
    assert sorted(c.schedule_id for c in taken.configs) == [i for i in ids if i % 4 == 1]
    # Tombstones are pruned once, by the holder of partition 0.
    async with engine.begin() as conn:
        await conn.execute(text(f"DELETE FROM periodic_jobs WHERE id = {other}"))
    assert await provider.prune_tombstones(datetime(2999, 1, 1, tzinfo=UTC)) == 0
    held = frozenset({0, 1, 3})
    assert await provider.prune_tombstones(datetime(2999, 1, 1, tzinfo=UTC)) == 1


async def test_a_full_reconcile_can_tell_that_nothing_changed_since_the_last_one(
    engine: AsyncEngine, backend: str
) -> None:
    ids = [await insert_row(engine, f"d{i}") for i in range(6)]
    provider = DatabaseProvider(engine)
    provider.adopt(PeriodicTaskConfig, lambda _id: None)  # as a manager does (holding nothing)
    assert not await provider.unchanged_since_full()  # no full read yet: nothing to compare
    await provider.get_configs()
    # A cold read (a start) takes no digest: the database would hash every row before sending
    # the first, and the start would wait for it. The first listing takes it.
    assert not await provider.unchanged_since_full()
    await provider.get_configs()
    if backend != "postgresql":
        assert not await provider.unchanged_since_full()  # no digest here: the rows are listed
        return
    assert await provider.unchanged_since_full()
    assert await provider.unchanged_since_full()  # asking changes nothing
    # Through the triggers: a new revision.
    await update_row(engine, ids[0], payload='{"v": 1}')
    assert not await provider.unchanged_since_full()
    await provider.get_configs()
    assert await provider.unchanged_since_full()
    # Past the triggers (as a restore or a replication tool writes): a row added with the
    # default revision, a row deleted without a tombstone, a row disabled, a revision set back.
    past_triggers = [
        "INSERT INTO periodic_jobs (name, spec, task_type) VALUES ('hidden', '0 0 * * *', 't')",
        f"DELETE FROM periodic_jobs WHERE id = {ids[1]}",
        f"UPDATE periodic_jobs SET enabled = false WHERE id = {ids[2]}",
        f"UPDATE periodic_jobs SET revision = revision - 1 WHERE id = {ids[3]}",
    ]
    for sql in past_triggers:
        async with engine.begin() as conn:
            await conn.execute(text("SET LOCAL session_replication_role = replica"))
            await conn.execute(text(sql))
        assert not await provider.unchanged_since_full(), sql
        await provider.get_configs()
        assert await provider.unchanged_since_full(), sql
    # A change read through the change feed since: the rows held are no longer those of the
    # last full read, so even that read's very pairs coming back past the triggers (an older
    # backup restored) are not taken for no change.
    snapshot = await provider.get_configs()
    async with engine.begin() as conn:
        old = (
            await conn.execute(text(f"SELECT revision FROM periodic_jobs WHERE id = {ids[4]}"))
        ).scalar()
    await update_row(engine, ids[4], payload='{"v": 2}')
    assert await provider.get_changes(snapshot.revision) is not None
    async with engine.begin() as conn:
        await conn.execute(text("SET LOCAL session_replication_role = replica"))
        await conn.execute(
            text(f"UPDATE periodic_jobs SET revision = {old}, payload = NULL WHERE id = {ids[4]}")
        )
    assert not await provider.unchanged_since_full()
    await provider.get_configs()
    assert await provider.unchanged_since_full()
    # The table cannot be read: the question fails as a read does (a failed sync, retried),
    # and a read that failed leaves nothing to compare with.
    async with engine.begin() as conn:
        await conn.execute(text("ALTER TABLE periodic_jobs RENAME TO periodic_jobs_away"))
    try:
        with pytest.raises(ProviderError):
            await provider.unchanged_since_full()
        with pytest.raises(ProviderError):
            await provider.get_configs()
    finally:
        async with engine.begin() as conn:
            await conn.execute(text("ALTER TABLE periodic_jobs_away RENAME TO periodic_jobs"))
    assert not await provider.unchanged_since_full()
    await provider.get_configs()
    assert await provider.unchanged_since_full()


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_a_digest_compares_only_reads_of_the_same_partitions(engine: AsyncEngine) -> None:
    ids = [await insert_row(engine, f"s{i}") for i in range(8)]
    held = frozenset({1, 3})
    provider = DatabaseProvider(engine)
    provider.restrict(lambda: PartitionsHeld(4, held))
    provider.adopt(PeriodicTaskConfig, lambda _id: None)
    await provider.get_configs()  # cold: no digest
    await provider.get_configs()
    assert await provider.unchanged_since_full()
    # A change to a row of a partition not held changes nothing of what this manager lists.
    await update_row(engine, next(i for i in ids if i % 4 == 0), payload='{"v": 1}')
    assert await provider.unchanged_since_full()
    await update_row(engine, next(i for i in ids if i % 4 == 3), payload='{"v": 1}')
    assert not await provider.unchanged_since_full()
    await provider.get_configs()
    assert await provider.unchanged_since_full()
    # Other partitions held: the last read covered others, so it cannot stand.
    held = frozenset({1, 2, 3})
    assert not await provider.unchanged_since_full()
    await provider.get_configs()
    assert await provider.unchanged_since_full()
    held = frozenset(range(4))  # every partition: the unfiltered read and its digest
    assert not await provider.unchanged_since_full()
    await provider.get_configs()
    assert await provider.unchanged_since_full()


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_a_read_of_partitions_comes_in_id_order_and_one_of_every_partition_is_unfiltered(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some partitions are read without ORDER BY (the planner cannot estimate ``id % n`` and
    sorted the whole table before the first row came): the configs and the row errors still
    come in id order. A takeover of every partition is read as an unrestricted read is, without
    the filter, a cold read of every partition in runs of them; and a provider holding no
    partition reads no row (a start before its first lease round)."""
    ids = [await insert_row(engine, f"o{i}") for i in range(12)]
    bad = [await insert_row(engine, f"bad{i}", spec="not a spec") for i in range(6)]
    held = frozenset[int]()
    provider = DatabaseProvider(engine)
    provider.restrict(lambda: PartitionsHeld(4, held))
    statements = streamed(engine, monkeypatch)
    nothing = await provider.get_configs()
    assert not nothing.configs and not nothing.errors and nothing.revision is not None
    assert statements == []
    held = frozenset({1, 2, 3})
    some = await provider.get_partitions(frozenset({1, 3}))
    assert [c.schedule_id for c in some.configs] == [i for i in ids if i % 4 in (1, 3)]
    assert [e.schedule_id for e in some.errors] == [i for i in bad if i % 4 in (1, 3)]
    assert "%" in statements[-1] and "ORDER BY" not in statements[-1]
    subset = DatabaseProvider(engine)  # a full read of some partitions: filtered, not ordered
    subset.restrict(lambda: PartitionsHeld(4, held))
    read = await subset.get_configs()
    assert [c.schedule_id for c in read.configs] == [i for i in ids if i % 4 in (1, 2, 3)]
    assert [e.schedule_id for e in read.errors] == [i for i in bad if i % 4 in (1, 2, 3)]
    assert "%" in statements[-1] and "ORDER BY" not in statements[-1]
    subset.adopt(PeriodicTaskConfig, {c.schedule_id: c for c in read.configs}.get)
    again = await subset.get_configs()  # a reconcile: the revisions, filtered, not ordered
    assert [c.schedule_id for c in again.configs] == [c.schedule_id for c in read.configs]
    assert "%" in statements[-1] and "ORDER BY" not in statements[-1]
    held = frozenset(range(4))
    every = await provider.get_partitions(held)
    assert [c.schedule_id for c in every.configs] == ids
    assert [e.schedule_id for e in every.errors] == bad
    assert "%" not in statements[-1]
    before = len(statements)
    full = await provider.get_configs()  # a cold read holding every partition: runs of them
    assert [c.schedule_id for c in full.configs] == ids and len(statements) == before + EVERY_RUNS


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_a_read_holding_no_partition_leaves_the_next_one_a_full_read_of_every_column(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first sync of a manager before its first lease round reads nothing: the read after
    it took every partition (a manager alone) is then one streamed read of every column, as a
    first sync's, not the revisions and then the rows by id of a warm reconcile."""
    ids = [await insert_row(engine, f"w{i}") for i in range(6)]
    held = frozenset[int]()
    provider = DatabaseProvider(engine)
    provider.restrict(lambda: PartitionsHeld(4, held))
    provider.adopt(PeriodicTaskConfig, lambda row_id: None)  # a manager's: nothing registered
    statements = streamed(engine, monkeypatch)
    assert (await provider.get_configs()).configs == [] and statements == []
    held = frozenset(range(4))
    read = await provider.get_configs()
    assert [c.schedule_id for c in read.configs] == ids
    # Every column, in runs of partitions (see the test of partitions handed over meanwhile).
    assert len(statements) == EVERY_RUNS and all("payload" in q for q in statements)


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_partitions_handed_over_during_a_read_of_every_row_are_read_no_further(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manager alone reads every row at its start, in runs of partitions in partition order
    (those it would hand over first, the highest, come last); a manager joining meanwhile makes
    it hand some over. What it read of those goes at once, the rest of the read keeps only the
    rows of the partitions still held, and a run of partitions all handed over is not read: its
    memory never holds much more than its share."""
    monkeypatch.setattr("periodic_manager.db.provider.FETCH_PARTITION", 3)
    ids = [await insert_row(engine, f"h{i}") for i in range(16)]
    bad = [await insert_row(engine, f"hbad{i}", spec="not a spec") for i in range(4)]
    held = frozenset(range(4))
    provider = DatabaseProvider(engine)
    provider.restrict(lambda: PartitionsHeld(4, held))
    statements = streamed(engine, monkeypatch)
    sort = provider._sort
    parts: list[list[int]] = []

    def sorting(part: Any, configs: list[Any], errors: list[Any]) -> None:
        nonlocal held
        parts.append([raw[0] for raw in part])
        sort(part, configs, errors)
        held = frozenset({1, 3})  # after the first part: partitions 0 and 2 are handed over

    monkeypatch.setattr(provider, "_sort", sorting)
    read = await provider.get_configs()
    assert [c.schedule_id for c in read.configs] == [i for i in ids if i % 4 in (1, 3)]
    assert [e.schedule_id for e in read.errors] == [i for i in bad if i % 4 in (1, 3)]
    assert len(parts[0]) == 3 and {i % 4 for i in parts[0]} == {0}  # the first run: partition 0
    assert all(i % 4 in (1, 3) for part in parts[1:] for i in part)  # none handed over after it
    assert len(statements) == 3  # the runs of partitions 0, 1 and 3: partition 2's is not read
    # The same in a takeover's read of some partitions (a third manager joins meanwhile).
    parts.clear()
    held = frozenset({0, 1, 2, 3})
    taken = await provider.get_partitions(frozenset({2, 3}))
    assert [c.schedule_id for c in taken.configs] == [i for i in ids if i % 4 == 3]
    assert parts[0] and {i % 4 for i in parts[0]} <= {2, 3}
    assert all(i % 4 == 3 for part in parts[1:] for i in part)


async def test_partitions_need_postgresql(engine: AsyncEngine, backend: str) -> None:
    provider = DatabaseProvider(engine)
    if backend != "postgresql":
        with pytest.raises(ValueError, match="partitions need PostgreSQL"):
            provider.restrict(lambda: PartitionsHeld(4, frozenset()))
    else:
        provider.restrict(lambda: PartitionsHeld(4, frozenset()))
        assert (await provider.get_configs()).configs == []  # nothing held, nothing read


async def test_mysql_columns_in_another_character_set_read_as_their_text(mariadb_url: str) -> None:
    """MariaDB/MySQL: a column an operator moved to another character set (latin1 here) is read
    as its text, converted to UTF-8 by the server (a manager never sees the stored bytes)."""
    await upgrade(mariadb_url)
    engine = create_engine(mariadb_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text("ALTER TABLE periodic_jobs MODIFY payload LONGTEXT CHARACTER SET latin1")
            )
        row = await insert_row(engine, "latin", payload='{"city": "Zürich", "café": "crème"}')
        snap = await DatabaseProvider(engine).get_configs()
        assert snap.errors == []
        [config] = snap.configs
        assert (config.schedule_id, config.payload) == (row, {"city": "Zürich", "café": "crème"})
    finally:
        await engine.dispose()
