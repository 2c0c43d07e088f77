"""The database provider: every enabled row of ``periodic_jobs``, judged one by one.

Rows are untrusted input (anyone with SQL access can write them): they are read and judged by
:mod:`periodic_manager.db.rows` and :mod:`periodic_manager.db.judge`, which never let the driver
interpret a column that could hold garbage and decide per row "usable config, disabled, or
RowError" — the same judgement the API shows. A row that cannot be used becomes a :class:`RowError` carrying a hash of the raw row, so
the manager can log it once per (row, content); every other row is returned. Any failure to read
the table is raised as :class:`~periodic_manager.errors.ProviderError`.

Cost follows change. Every row carries a ``revision`` (a trigger bumps it on each write), and
each config keeps the revision it was read at. A manager hands the provider ``known`` (the
config it holds for a row id): a full read first lists ``(id, revision)`` and reads the columns
only of rows whose revision differs from what is known, so a full reconcile of 100,000 unchanged
rows is one narrow query; on PostgreSQL, when nothing was written since the last full read, not
even that: one aggregate query says so (:meth:`DatabaseProvider.unchanged_since_full`). On
PostgreSQL the rows are read with the driver itself, through a cursor in partitions that are
judged as they arrive: no result of a million rows is ever held, and the event loop is never
held for long. Restricted to the partitions a manager holds, the reads cover only their rows
(:mod:`periodic_manager.db.provider_scope`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Select,
    any_,
    bindparam,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.contracts import ChangeSet, HeldPartitions, Known, ProviderSnapshot, RowError
from periodic_manager.db import calendars as dbcalendars
from periodic_manager.db import changes
from periodic_manager.db import judge as dbjudge
from periodic_manager.db import rows as dbrows
from periodic_manager.db.engine import reads_bytes
from periodic_manager.db.models import jobs_table
from periodic_manager.db.provider_scope import PartitionScope, Scope, digest_of
from periodic_manager.errors import ProviderError
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.partition import every_partition
from periodic_manager.schedules.rules import DEFAULT_MAX_PAYLOAD_BYTES

# Rows are read in partitions of this many, each judged before the next is read.
FETCH_PARTITION = 2000
# Ids per query when the columns of changed rows are read by id.
IDS_PER_QUERY = 5000
Verdict = PeriodicTaskConfig | RowError | None


class DatabaseProvider(PartitionScope):
    """An :class:`~periodic_manager.contracts.IncrementalProvider` reading ``periodic_jobs``
    (and a :class:`~periodic_manager.contracts.DigestingProvider`: on PostgreSQL it can tell).

    A manager :meth:`adopt` s it: valid rows become its entries, and after the first full read the
    rows whose revision matches the config it holds are not read again (see the module doc).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        check: Callable[[PeriodicTaskConfig], None] | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        task_check: dbjudge.TaskCheck | None = None,
    ) -> None:
        """``check`` may reject a valid config for deployment reasons (e.g. an unconfigured
        target) by raising ConfigError; the row is then reported like any bad row.
        ``task_check``: what the row's target refuses in its task (``judge.task_check``), reported
        the same way.
        ``max_payload_bytes``: a row whose payload or options (canonical JSON) is larger is a
        row error (``PM_MAX_PAYLOAD_BYTES``, the limit the API enforces on writes)."""
        self.engine = engine
        self.check = check
        self._bytes = reads_bytes(engine)
        self.rules = dbjudge.Rules(self._bytes, max_payload_bytes, check, task_check=task_check)
        self._judge = dbjudge.RowJudge(self.rules)
        self.known: Known | None = None  # set by adopt()
        self._warm = False  # a full read has succeeded: from now on ``known`` is worth asking
        self._types_checked = False
        # Rejected rows by id, with the revision they were judged at: a bad row is not judged
        # again until it changes (good rows are remembered by the manager's entries).
        self._errors: dict[int, tuple[int, RowError]] = {}
        t = jobs_table.c
        cols = [*dbrows.columns(self._bytes), t.revision]
        self._full = select(*cols).where(dbrows.not_disabled(self._bytes)).order_by(t.id)
        self._changed = changes.rows_since(cols)
        by_ids: ColumnElement[bool]
        if self._bytes:
            by_ids = t.id.in_(bindparam("ids", expanding=True))
        else:  # one array parameter: the statement text stays the same whatever the count
            by_ids = t.id == any_(bindparam("ids", type_=ARRAY(BigInteger)))
        self._by_ids = select(*cols).where(by_ids).order_by(t.id)
        self._revisions = (
            select(t.id, t.revision).where(dbrows.not_disabled(self._bytes)).order_by(t.id)
        )
        # PostgreSQL: the digest of what a full reconcile lists (see unchanged_since_full), and
        # the scope and digest of the last full read (None: none to compare with).
        self._digest = self._every_digest = digest_of(self._revisions)
        self._digested: tuple[Scope, tuple[Any, ...]] | None = None
        self._held: HeldPartitions | None = None  # set by restrict()
        # Restricted: the unfiltered reads, used while every partition is held (see _every).
        self._every_full = self._full
        self._every_revisions = self._revisions
        self._some = self._full  # the rows of the partitions taken (set by restrict())
        self._run = self._full  # the rows of a range of partitions (set by restrict())

    async def unchanged_since_full(self) -> bool:
        """Whether the rows a full reconcile would list now (``id`` and ``revision`` of every
        row not disabled, of the partitions held) are exactly those the last full read listed,
        over the same partitions: one aggregate query, outside a transaction, whose work is the
        database's (at rest with a million rows the manager would otherwise receive and compare
        a million pairs every ``full_sync_interval``). False on SQLite and MariaDB/MySQL (no
        digest: their full reconcile lists the rows), before the first full read that lists the
        pairs (a start's read of every column takes no digest), after a failed one, and when
        the partitions held have changed since.

        The digest is the count of those rows and the sum of a 64-bit hash of each pair
        (PostgreSQL's ``hashint8extended``: the id hashed with the revision as seed). A write
        through the triggers gives a row a new revision, and one that bypasses them (triggers
        disabled, ``session_replication_role = replica``) changes a pair, adds one or removes one:
        a change goes unseen only if its hashes cancel out exactly, one chance in 2**64. A
        change read since (:meth:`get_changes`) ends the digest's use until the next full read:
        from then on the manager holds more than that read."""
        seen = self._digested
        if seen is None or seen[0] != self._scope_now():
            return False
        try:
            async with self.engine.connect() as conn:
                conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                digest = await self._digest_now(conn, self._every())
        except Exception as exc:
            raise ProviderError(f"cannot read periodic_jobs: {exc}") from exc
        return digest == seen[1]

    async def get_partitions(self, partitions: frozenset[int]) -> ProviderSnapshot:
        """Every enabled row of ``partitions``, read in full (a manager that has just taken them
        holds nothing of them). ``revision``: the watermark before the rows were read."""
        assert self._held is not None, "restrict() first"
        configs: list[PeriodicTaskConfig] = []
        errors: list[RowError] = []
        count = self._held().count
        query: Select[Any]
        if every_partition(partitions, count):
            # Every partition (a manager alone, at its start): the read of a first sync, one
            # index scan streamed as it is judged; rows of partitions lost meanwhile are
            # left out by the caller (the reconciler's ``keep``).
            query, params = self._every_full, {}
        else:
            query = self._some
            params = self._scope({"taken_partitions": sorted(partitions)})
            params["partition_count"] = count
        try:
            async with self.engine.connect() as conn:
                revision = await changes.current_revision(conn)
                await self._read_calendars(conn)
                read = self._reading()
                async for part in self._stream(conn, query, params):
                    self._sort(read.still_held(part, configs, errors), configs, errors)
                    await asyncio.sleep(0)
        except Exception as exc:
            raise ProviderError(f"cannot read periodic_jobs: {exc}") from exc
        configs.sort(key=_row_id)
        errors.sort(key=_error_id)
        self._warm = True  # their rows are registered: later reads ask ``known`` first
        return ProviderSnapshot(configs=configs, errors=errors, revision=revision)

    def adopt(self, build: type[PeriodicTaskConfig], known: Known) -> None:
        """Build valid rows as ``build`` (a manager's entry class: no copy per schedule), and
        after the first full read ask ``known(row_id)`` before reading a row's columns."""
        self._judge.config_class = build
        self.known = known

    async def get_configs(self) -> ProviderSnapshot:
        """Every enabled, valid row as a config, and a RowError for each enabled, invalid row.

        ``revision`` is the change counter read before the rows: any write committed after it has
        a larger revision (writers are serialized), so changes since are exactly ``> revision``.
        Raises ProviderError if the table cannot be read (connection refused, timeout, missing
        table or database, ...).
        """
        configs: list[PeriodicTaskConfig] = []
        errors: list[RowError] = []
        errors_before, self._errors = self._errors, {}
        self._types_checked = False  # the column types are read again by every read of rows
        scope, self._digested = self._scope_now(), None
        digest: tuple[Any, ...] | None = None
        try:
            async with self.engine.connect() as conn:
                listing = self.known is not None and self._warm
                if listing and not self._bytes:
                    # One snapshot for the watermark, the calendars, the digest and the rows:
                    # the digest is exactly that of the pairs listed. (Not at a cold read: the
                    # database would hash every row before the first one is sent, and a start
                    # waits for that; the first full reconcile due takes it.)
                    conn = await conn.execution_options(isolation_level="REPEATABLE READ")
                revision = await changes.current_revision(conn)
                await self._read_calendars(conn)
                every = self._every()
                full = self._every_full if every else self._full
                nothing = self._nothing_held()
                if listing and not self._bytes and not nothing:
                    digest = await self._digest_now(conn, every)
                if nothing:
                    pass  # no partition held (a start before its first round): no row is mine
                elif not listing:
                    # Nothing held yet (a cold start): every column read once (_cold_reads).
                    read = self._reading()
                    for cold in self._cold_reads(every, full):
                        if not read.any_held(cold.partitions):
                            continue  # a run of partitions handed over before it began
                        async for part in self._stream(conn, cold.query, cold.params):
                            self._sort(read.still_held(part, configs, errors), configs, errors)
                            await asyncio.sleep(0)
                else:
                    stale = await self._reuse(conn, configs, errors, errors_before)
                    for i in range(0, len(stale), IDS_PER_QUERY):
                        params = {"ids": stale[i : i + IDS_PER_QUERY]}
                        async for part in self._stream(conn, self._by_ids, params):
                            self._sort(part, configs, errors)
                            await asyncio.sleep(0)
        except Exception as exc:
            # Drivers raise a spread of types here (SQLAlchemy's wrappers, but also OSError,
            # TimeoutError and driver-native errors raised while connecting). Whatever stops the
            # read is a provider failure: the manager keeps its entries and retries.
            self._errors = errors_before
            raise ProviderError(f"cannot read periodic_jobs: {exc}") from exc
        configs.sort(key=_row_id)
        errors.sort(key=_error_id)
        # A read of nothing warms nothing: the read that follows the first round of a manager
        # alone is then one streamed read of every row, as a first sync's.
        self._warm = self._warm or not nothing
        if digest is not None:
            self._digested = (scope, digest)
        return ProviderSnapshot(configs=configs, errors=errors, revision=revision)

    async def _reuse(
        self,
        conn: AsyncConnection,
        configs: list[PeriodicTaskConfig],
        errors: list[RowError],
        errors_before: dict[int, tuple[int, RowError]],
    ) -> list[int]:
        """Keep what is known at its revision; return the ids whose columns must be read."""
        known = self.known
        assert known is not None
        stale: list[int] = []
        every = self._every()
        query = self._every_revisions if every else self._revisions
        async for part in self._stream(conn, query, {} if every else self._scope()):
            for row_id, revision in part:
                config = known(row_id)
                if config is not None and config.revision == revision:
                    configs.append(config)
                    continue
                bad = errors_before.get(row_id)
                if bad is not None and bad[0] == revision:
                    self._errors[row_id] = bad
                    errors.append(bad[1])
                    continue
                stale.append(row_id)
            await asyncio.sleep(0)
        return stale

    def _sort(
        self, part: Sequence[Any], configs: list[PeriodicTaskConfig], errors: list[RowError]
    ) -> None:
        judge = self._judge
        for raw in part:
            verdict = judge(raw)
            if isinstance(verdict, PeriodicTaskConfig):
                configs.append(verdict)
            elif verdict is not None:
                errors.append(verdict)
                self._errors[raw[0]] = (raw[dbrows.N_JUDGED], verdict)

    def judge_stored(self, raw: Sequence[Any]) -> PeriodicTaskConfig | RowError:
        """A last good version read back from the runtime store (``raw`` as a row: id, enabled,
        content, effective_at), judged as this provider judges a row: it is data like any other,
        so it runs only if it is still a usable schedule here (the target check included)."""
        return dbjudge.judge_content(self._judge.rules, raw)

    async def _read_calendars(self, conn: AsyncConnection) -> None:
        """The calendars rows are judged against (options.exclude), read after the revision and
        before the rows: a calendar written after this read renews the revision of every row
        that names it past the one read, so those rows are read again at the next sync."""
        self._judge.rules = self.rules.with_calendars(await dbcalendars.specs(conn))

    async def get_changes(self, since: int) -> ChangeSet | None:
        """What changed after revision ``since``: None (one indexed query) when nothing did."""
        configs: list[PeriodicTaskConfig] = []
        errors: list[RowError] = []
        removed: list[str] = []
        self._types_checked = False
        try:
            # At rest nothing changed: one round trip outside a transaction says so.
            if changes.unchanged(await changes.peek(self.engine), since):
                return None
            async with self.engine.connect() as conn:
                found = await changes.changes_since(conn, since)
                if found is None:
                    return None
                # The manager's rows move on from the last full read's: its digest no longer
                # says what the manager holds (the very pairs of that read written back past
                # the triggers, as by restoring an old backup, must not pass for no change).
                self._digested = None
                if found.full:  # TRUNCATE: no tombstone per row, read everything
                    return ChangeSet(revision=found.revision, full=True)
                await self._read_calendars(conn)
                async for part in self._stream(conn, self._changed, self._scope({"since": since})):
                    for raw in part:
                        self._errors.pop(raw[0], None)
                        verdict = self._judge(raw)
                        if verdict is None:  # disabled
                            removed.append(str(raw[0]))
                        elif isinstance(verdict, RowError):
                            errors.append(verdict)
                            self._errors[raw[0]] = (raw[dbrows.N_JUDGED], verdict)
                        else:
                            configs.append(verdict)
                    await asyncio.sleep(0)  # a bulk INSERT of 100,000 rows must not hold the loop
        except Exception as exc:
            raise ProviderError(f"cannot read periodic_jobs: {exc}") from exc
        for row_id in found.deleted:
            self._errors.pop(row_id, None)
        present = {c.key for c in configs} | {str(e.schedule_id) for e in errors}
        # A deleted id that was written again after its deletion is present, not removed.
        gone = [str(i) for i in found.deleted] + removed
        removed = [k for k in dict.fromkeys(gone) if k not in present]
        return ChangeSet(revision=found.revision, configs=configs, errors=errors, removed=removed)

    async def prune_tombstones(self, older_than: datetime) -> int:
        """Delete tombstones older than ``older_than`` (a full read makes up for any pruned).
        Restricted to partitions, only the holder of partition 0 prunes (work done once)."""
        if self._held is not None and 0 not in self._held().partitions:
            return 0
        return await changes.prune_tombstones(self.engine, older_than)

    async def _check_types(self, conn: AsyncConnection) -> None:
        """Once per read of rows: whether ``payload`` is of type jsonb (then its text is valid
        JSON). Read again each time, so a column altered under a running manager is noticed at
        its next read (one catalog lookup; a sync that finds nothing changed reads no rows)."""
        if self._bytes or self._types_checked:
            return
        kind = (
            await conn.execute(
                text(
                    "SELECT data_type FROM information_schema.columns WHERE table_name ="
                    " 'periodic_jobs' AND column_name = 'payload' AND table_schema = current_schema()"
                )
            )
        ).scalar()
        self._judge.jsonb = kind == "jsonb"
        self._types_checked = True

    async def _stream(
        self, conn: AsyncConnection, query: Select[Any], params: dict[str, Any] | None = None
    ) -> AsyncIterator[Sequence[Any]]:
        """The rows of ``query`` in partitions of FETCH_PARTITION.

        PostgreSQL: the driver's own cursor (asyncpg records, no SQLAlchemy row objects: half
        the cost per row); SQLite and MariaDB/MySQL: SQLAlchemy's partitions."""
        await self._check_types(conn)
        if self._bytes:
            result = await conn.stream(query.execution_options(yield_per=FETCH_PARTITION), params)
            async for part in result.partitions():
                yield part
            return
        compiled = query.compile(dialect=conn.dialect)
        values = compiled.construct_params(params or {})
        args = [values[name] for name in compiled.positiontup or ()]
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        # A cursor lives in a transaction; SQLAlchemy has begun one (the revision was read).
        async with contextlib.AsyncExitStack() as stack:
            if not driver.is_in_transaction():
                await stack.enter_async_context(driver.transaction())
            cursor = await driver.cursor(str(compiled), *args)
            while part := await cursor.fetch(FETCH_PARTITION):
                yield part


def _row_id(config: PeriodicTaskConfig) -> Any:
    return config.schedule_id


def _error_id(error: RowError) -> tuple[bool, Any]:
    return (isinstance(error.schedule_id, str), error.schedule_id)
