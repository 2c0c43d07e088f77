"""The column types of the tables (:mod:`periodic_manager.db.models`) that differ per database:
ids, JSON values, long text and instants, each one type whatever the database; and the columns
several tables share, each defined once."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, DateTime, Integer, String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

# BIGINT on PostgreSQL; INTEGER on SQLite, where only "INTEGER PRIMARY KEY" is the rowid alias.
BigId = BigInteger().with_variant(Integer(), "sqlite")
# Ids are never handed out twice: PostgreSQL's BIGSERIAL sequences never do; SQLite needs
# AUTOINCREMENT (``sqlite_autoincrement=True`` on the tables of ``models.py`` whose ids are never reused), or
# it reuses the id of the newest row once that row is deleted (migration 0007).


class _LongTextImpl(TypeDecorator[Any]):
    """TEXT, LONGTEXT on MariaDB/MySQL. The MySQL dialect is imported by a process that talks to
    MySQL, not by every process that imports the models (a manager on PostgreSQL)."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name in ("mysql", "mariadb"):
            from sqlalchemy.dialects.mysql import LONGTEXT

            return dialect.type_descriptor(LONGTEXT())
        return super().load_dialect_impl(dialect)


class JsonText(_LongTextImpl):
    """MariaDB/MySQL: a JSON value kept as LONGTEXT with no JSON check, so that a row holding
    invalid JSON text can be stored (by plain SQL) and then reported by the row judge."""

    def process_bind_param(self, value: Any, dialect: Dialect) -> str:
        return json.dumps(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> Any:
        return None if value is None else json.loads(value)


JsonValue = (
    JSON(none_as_null=False)
    .with_variant(JSONB(none_as_null=False), "postgresql")
    .with_variant(JsonText(), "mysql", "mariadb")
)


# Text that may be longer than MySQL's TEXT (64 KiB): JSON of a payload, of a change.
LongText = _LongTextImpl()


class UTCDateTime(TypeDecorator[datetime]):
    """An instant: aware datetimes in, aware UTC datetimes out, on every backend.

    SQLite and MariaDB/MySQL have no zone-aware type; values are stored as UTC and read back
    tagged as UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        # MariaDB/MySQL: DATETIME(6), holding UTC (a plain DATETIME drops the microseconds).
        if dialect.name in ("mysql", "mariadb"):
            from sqlalchemy.dialects.mysql import DATETIME

            return dialect.type_descriptor(DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("naive datetime given for a timestamp column; pass an aware instant")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


Instant = UTCDateTime()


# Columns that several tables share, each defined once.


def serial_id() -> Column[Any]:
    """An id the database hands out, never twice (see :data:`BigId`)."""
    return Column("id", BigId, primary_key=True, autoincrement=True)


def at_column(name: str, **kw: Any) -> Column[Any]:
    """An instant (UTC on every database)."""
    return Column(name, Instant, **kw)


def schedule_key_column(**kw: Any) -> Column[Any]:
    """A schedule's key: its row id, or ``name:<name>`` for a schedule registered in code."""
    return Column("schedule_key", String(128), **kw)


def name_column(**kw: Any) -> Column[Any]:
    """A schedule's name."""
    return Column("name", String(200), **kw)
