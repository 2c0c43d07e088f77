"""The database provider: every enabled row of ``periodic_jobs``, judged one by one.

Rows are untrusted input (anyone with SQL access can write them): they are read and judged by
:mod:`periodic_manager.db.rows`, which never lets the driver interpret a column that could hold
garbage and decides per row "usable config, disabled, or RowError" — the same judgement the API
shows. A row that cannot be used becomes a :class:`RowError` carrying a hash of the raw row, so
the manager can log it once per (row, content); every other row is returned. Any failure to read
the table is raised as :class:`~periodic_manager.errors.ProviderError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Select, bindparam, delete, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.config import DEFAULT_MAX_PAYLOAD_BYTES, PeriodicTaskConfig
from periodic_manager.db import rows as dbrows
from periodic_manager.db.models import DeletedJob, PeriodicJob
from periodic_manager.errors import ProviderError
from periodic_manager.providers.base import ChangeSet, ProviderSnapshot, RowError

YIELD_EVERY = 500
# Rows are read through a cursor in partitions of this many: one result of 100,000 rows read at
# once blocks the event loop for half a second (decoding and row building), which a leader
# proving its leadership every second cannot afford.
FETCH_PARTITION = 1000
Verdict = PeriodicTaskConfig | RowError | None


class DatabaseProvider:
    """A :class:`~periodic_manager.providers.base.ConfigProvider` reading ``periodic_jobs``.

    One SELECT per call; the engine's pool supplies the connection and gets it back before the
    rows are validated, so validation time never holds a connection.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        check: Callable[[PeriodicTaskConfig], None] | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        """``check`` may reject a valid config for deployment reasons (e.g. an unconfigured
        target) by raising ConfigError; the row is then reported like any bad row.
        ``max_payload_bytes``: a row whose payload or options (canonical JSON) is larger is a
        row error (``PM_MAX_PAYLOAD_BYTES``, the limit the API enforces on writes)."""
        self.engine = engine
        self.check = check
        self._sqlite = engine.dialect.name == "sqlite"
        self.rules = dbrows.Rules(self._sqlite, max_payload_bytes, check)
        # row id -> (raw row, its verdict): an unchanged row is not judged again, and comes
        # back as the same object (the manager then skips hashing it).
        self._cache: dict[int, tuple[tuple[Any, ...], Verdict]] = {}
        self._query = _build_query(self._sqlite)
        self._changed_query = _build_query(self._sqlite, changed=True)

    async def get_configs(self) -> ProviderSnapshot:
        """Every enabled, valid row as a config, and a RowError for each enabled, invalid row.

        ``revision`` is the change counter read before the rows: any write committed after it has
        a larger revision (writers are serialized), so changes since are exactly ``> revision``.
        Raises ProviderError if the table cannot be read (connection refused, timeout, missing
        table or database, ...).
        """
        try:
            async with self.engine.connect() as conn:
                revision = await _current_revision(conn)
                rows = await _fetch(conn, self._query)
        except Exception as exc:
            # Drivers raise a spread of types here (SQLAlchemy's wrappers, but also OSError,
            # TimeoutError and driver-native errors raised while connecting). Whatever stops the
            # read is a provider failure: the manager keeps its entries and retries.
            raise ProviderError(f"cannot read periodic_jobs: {exc}") from exc
        configs: list[PeriodicTaskConfig] = []
        errors: list[RowError] = []
        previous, self._cache = self._cache, {}
        for i, row in enumerate(rows):
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # judging 100,000 rows must not starve the event loop
            result = self._cached_judge(tuple(row), previous)
            if isinstance(result, RowError):
                errors.append(result)
            elif result is not None:
                configs.append(result)
        return ProviderSnapshot(configs=configs, errors=errors, revision=revision)

    def _cached_judge(
        self, raw: tuple[Any, ...], previous: dict[int, tuple[tuple[Any, ...], Verdict]]
    ) -> Verdict:
        row_id = raw[0]
        hit = previous.get(row_id)
        result = hit[1] if hit is not None and hit[0] == raw else dbrows.judge(self.rules, raw)
        self._cache[row_id] = (raw, result)
        return result

    async def get_changes(self, since: int) -> ChangeSet | None:
        """What changed after revision ``since``: None (one indexed query) when nothing did."""
        try:
            async with self.engine.connect() as conn:
                revision = await _current_revision(conn)
                if revision <= since:
                    return None
                rows = await _fetch(conn, self._changed_query, {"since": since})
                deleted = (
                    (await conn.execute(select(DeletedJob.id).where(DeletedJob.revision > since)))
                    .scalars()
                    .all()
                )
        except Exception as exc:
            raise ProviderError(f"cannot read periodic_jobs: {exc}") from exc
        if 0 in deleted:  # TRUNCATE: no tombstone per row, read everything
            return ChangeSet(revision=revision, full=True)
        configs: list[PeriodicTaskConfig] = []
        errors: list[RowError] = []
        removed = [str(i) for i in deleted]
        for row_id in deleted:
            self._cache.pop(row_id, None)
        for i, row in enumerate(rows):
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # a bulk INSERT of 100,000 rows must not starve the loop
            result = self._cached_judge(tuple(row), self._cache)
            if result is None:  # disabled
                removed.append(str(row[0]))
                self._cache.pop(row[0], None)
            elif isinstance(result, RowError):
                errors.append(result)
            else:
                configs.append(result)
        present = {c.key for c in configs} | {str(e.schedule_id) for e in errors}
        # A deleted id that was written again after its deletion is present, not removed.
        removed = [k for k in dict.fromkeys(removed) if k not in present]
        return ChangeSet(revision=revision, configs=configs, errors=errors, removed=removed)

    async def prune_tombstones(self, older_than: datetime) -> int:
        """Delete tombstones older than ``older_than`` (a full read makes up for any pruned)."""
        async with self.engine.begin() as conn:
            result = await conn.execute(
                delete(DeletedJob).where(DeletedJob.deleted_at < older_than)
            )
        return int(result.rowcount or 0)


def _build_query(sqlite: bool, *, changed: bool = False) -> Select[Any]:
    """Full read: every row not surely disabled (the judge decides). Changed read: every row
    with ``revision > :since``, so rows disabled since can be removed."""
    t = PeriodicJob.__table__.c
    query = select(*dbrows.columns(sqlite)).order_by(t.id)
    if changed:
        return query.where(t.revision > bindparam("since"))
    return query.where(dbrows.not_disabled(sqlite))


async def _fetch(
    conn: AsyncConnection, query: Select[Any], params: dict[str, Any] | None = None
) -> list[Any]:
    """Every row of ``query``, read through a cursor in partitions of FETCH_PARTITION."""
    rows: list[Any] = []
    result = await conn.stream(query.execution_options(yield_per=FETCH_PARTITION), params)
    async for part in result.partitions():
        rows.extend(part)
    return rows


async def _current_revision(conn: AsyncConnection) -> int:
    """The largest revision of a row or a tombstone: two index lookups."""
    rows = select(func.coalesce(func.max(PeriodicJob.revision), 0)).scalar_subquery()
    tombs = select(func.coalesce(func.max(DeletedJob.revision), 0)).scalar_subquery()
    latest_row, latest_tombstone = (await conn.execute(select(rows, tombs))).one()
    return int(max(latest_row, latest_tombstone))
