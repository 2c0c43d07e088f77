"""The database provider: every enabled row of ``periodic_jobs``, validated one by one.

Rows are untrusted input (anyone with SQL access can write them), so the provider never lets the
driver interpret a column that could hold garbage:

- ``payload`` and ``options`` are read as raw text and parsed here, because SQLite's JSON column
  may hold text that is not JSON at all, and a JSON decode failure inside the driver would break
  the whole query rather than one row.
- On SQLite every other column is read as raw bytes and decoded here: a column of any declared
  type may hold a blob with invalid UTF-8 or a timestamp string SQLAlchemy cannot parse, and either
  would raise while fetching, again for the whole result. PostgreSQL enforces its types and
  encoding, so there the typed columns are read as they are.

A row that cannot be used becomes a :class:`RowError` carrying a hash of the raw row, so the
manager can log it once per (row, content); every other row is returned. Any failure to read
the table is raised as :class:`~periodic_manager.errors.ProviderError`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    LargeBinary,
    Select,
    Text,
    bindparam,
    cast,
    delete,
    func,
    select,
    true,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from periodic_manager.config import UNKNOWN_START, PeriodicTaskConfig
from periodic_manager.db.models import DeletedJob, PeriodicJob
from periodic_manager.errors import ConfigError, ProviderError
from periodic_manager.providers.base import ChangeSet, ProviderSnapshot, RowError

YIELD_EVERY = 500

# The raw columns of a row, in the order they are selected and hashed.
_FIELDS = ("name", "spec", "timezone", "anchor", "task_type", "payload", "options", "effective_at")


class DatabaseProvider:
    """A :class:`~periodic_manager.providers.base.ConfigProvider` reading ``periodic_jobs``.

    One SELECT per call; the engine's pool supplies the connection and gets it back before the
    rows are validated, so validation time never holds a connection.
    """

    def __init__(
        self, engine: AsyncEngine, *, check: Callable[[PeriodicTaskConfig], None] | None = None
    ) -> None:
        """``check`` may reject a valid config for deployment reasons (e.g. an unconfigured
        target) by raising ConfigError; the row is then reported like any bad row."""
        self.engine = engine
        self.check = check
        # row id -> (raw row, its config or RowError): an unchanged row is not validated again,
        # and comes back as the same object (the manager then skips hashing it).
        self._cache: dict[int, tuple[tuple[Any, ...], PeriodicTaskConfig | RowError]] = {}
        self._sqlite = engine.dialect.name == "sqlite"
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
                await asyncio.sleep(0)  # validating 100,000 rows must not starve the event loop
            result = self._cached_convert(row[0], tuple(row[1:]), previous)
            if isinstance(result, RowError):
                errors.append(result)
            else:
                configs.append(result)
        return ProviderSnapshot(configs=configs, errors=errors, revision=revision)

    def _cached_convert(
        self,
        row_id: int,
        raw: tuple[Any, ...],
        previous: dict[int, tuple[tuple[Any, ...], PeriodicTaskConfig | RowError]],
    ) -> PeriodicTaskConfig | RowError:
        hit = previous.get(row_id)
        result = hit[1] if hit is not None and hit[0] == raw else self._convert(row_id, raw)
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
            enabled = row[1]
            if not _truthy(enabled):
                removed.append(str(row[0]))
                self._cache.pop(row[0], None)
                continue
            result = self._cached_convert(row[0], tuple(row[2:]), self._cache)
            (errors if isinstance(result, RowError) else configs).append(result)  # type: ignore[arg-type]
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

    def _convert(self, row_id: int, raw: tuple[Any, ...]) -> PeriodicTaskConfig | RowError:
        """Build one config, or the RowError that explains why this row cannot be used."""
        values = dict(zip(_FIELDS, raw, strict=True))
        name = values["name"]
        if isinstance(name, bytes):  # SQLite: name the row in the error if its name is text
            name = name.decode("utf-8", errors="replace")
        try:
            if self._sqlite:
                values = {k: v if k == "effective_at" else _decode(k, v) for k, v in values.items()}
                values["anchor"] = _parse_sqlite_instant("anchor", values["anchor"])
            config = PeriodicTaskConfig.create(
                effective_at=_effective_at(values["effective_at"]),
                name=values["name"],
                spec=values["spec"],
                task_type=values["task_type"],
                payload=_parse_json("payload", values["payload"]),
                options=_parse_options(values["options"]),
                timezone=values["timezone"],
                anchor=values["anchor"],
                schedule_id=row_id,
            )
            if self.check is not None:
                self.check(config)
            return config
        except ConfigError as exc:
            field, reason = exc.field, exc.reason
        except Exception as exc:
            # A row must never stop the others, even if it trips something unforeseen in the
            # validators (an overflow deep in the cron engine, say): report it like any bad row.
            field, reason = "row", f"unexpected {type(exc).__name__}: {exc}"
        return RowError(
            schedule_id=row_id,
            name=name if isinstance(name, str) else None,
            content_hash=raw_content_hash(row_id, raw),
            field=field,
            reason=reason,
        )


def _build_query(sqlite: bool, *, changed: bool = False) -> Select[Any]:
    """Full read: enabled rows. Changed read: every row with ``revision > :since``, with
    ``enabled`` second so disabled rows can be removed."""
    t = PeriodicJob.__table__.c
    cols: list[ColumnElement[Any]]
    if sqlite:
        # CAST AS BLOB returns the stored bytes (or the text form of a number) without any
        # decoding by the driver; NULL stays NULL.
        cols = [cast(t[name], LargeBinary).label(name) for name in _FIELDS]
    else:
        cols = [t.name, t.spec, t.timezone, t.anchor, t.task_type]
        cols += [cast(t.payload, Text).label("payload"), cast(t.options, Text).label("options")]
        cols += [cast(t.effective_at, Text).label("effective_at")]
    if changed:
        enabled = cast(t.enabled, LargeBinary) if sqlite else t.enabled
        return (
            select(t.id, enabled.label("enabled"), *cols)
            .where(t.revision > bindparam("since"))
            .order_by(t.id)
        )
    return select(t.id, *cols).where(t.enabled.is_(true())).order_by(t.id)


FETCH_PARTITION = 1000


async def _fetch(conn: AsyncConnection, query: Select[Any], params: dict[str, Any] | None = None) -> list[Any]:
    """Every row of ``query``, read through a cursor in partitions: one result of 100,000 rows
    read at once blocks the event loop for half a second (decoding and row building), which a
    leader proving its leadership every second cannot afford."""
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


def _truthy(value: Any) -> bool:
    """``enabled`` as stored: a bool (PostgreSQL) or, read raw on SQLite, what ``enabled IS 1``
    (the full read's filter) accepts, so both reads agree on odd values."""
    if isinstance(value, bytes):
        return value == b"1"
    return bool(value)


def raw_content_hash(row_id: int, raw: Sequence[Any]) -> str:
    """sha256 of a row's raw content: changes whenever any column the provider reads changes."""
    doc = [row_id, *(_raw_repr(v) for v in raw)]
    return hashlib.sha256(json.dumps(doc, ensure_ascii=True).encode()).hexdigest()


def _raw_repr(value: Any) -> Any:
    if value is None or isinstance(value, str | int):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return repr(value)


def _decode(field: str, value: Any) -> Any:
    if not isinstance(value, bytes):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(field, "not valid UTF-8 text") from None


def _parse_json(field: str, text: str | None) -> Any:
    """Parse a JSON column read as text; SQL NULL means JSON null."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError and integers beyond Python's digit limit.
        raise ConfigError(field, f"not valid JSON: {exc}") from None


def _parse_options(text: str | None) -> dict[str, Any] | None:
    options = _parse_json("options", text)
    # Checked here because PeriodicTaskConfig.create calls dict() on options before validating
    # them, so a JSON array or string would surface as a TypeError instead of a ConfigError.
    if options is not None and not isinstance(options, dict):
        raise ConfigError("options", "must be a JSON object")
    return options


def _parse_sqlite_instant(field: str, text: str | None) -> datetime | None:
    """A timestamp as SQLite stores it. SQLAlchemy writes naive UTC text there (see
    ``UTCDateTime``), so a value without an offset is UTC; one with an offset is honoured."""
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(field, f"not an ISO 8601 timestamp: {text[:50]!r}") from None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def _effective_at(text: Any) -> datetime:
    """The row's ``effective_at`` as read (text on both backends); unknown when missing or not an
    instant we can use (NULL, 'infinity', BC, year 10000...): then nothing before now is sent."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str):
        return UNKNOWN_START
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        return UNKNOWN_START
    if value.tzinfo is None:  # SQLite keeps naive UTC text
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:  # year 1 with a positive offset
        return UNKNOWN_START
