"""``periodic_jobs`` rows as untrusted data: the one reader of their columns, for the manager, the
API, the dashboard and the export.

Anyone with SQL access writes these rows, so no column may be interpreted by the driver, where
one bad value fails the whole query (an anchor in year 10000 or BC on PostgreSQL, non-UTF-8
bytes or a non-ISO timestamp on SQLite, ...). :func:`columns` selects every column in a form the
driver always delivers:

- SQLite: ``CAST(column AS BLOB)``: the stored bytes (or the text form of a number), undecoded.
- MariaDB/MySQL: the bytes of the column's text in UTF-8 (``CONVERT(.. USING utf8mb4)``, so a
  column in another character set reads right), undecoded: numbers as their digits, instants
  as ``DATETIME`` text in UTC (a zero date ``0000-00-00`` is text like any other, judged bad).

The parameter ``sqlite`` of the functions here means "read as bytes": SQLite and MariaDB/MySQL
(:func:`periodic_manager.db.engine.reads_bytes`); PostgreSQL reads typed values.
- PostgreSQL: text and boolean columns as they are (the server enforces their type and
  encoding), JSONB as text, timestamps as the text of their epoch seconds (independent of the
  session's ``TimeZone`` and ``DateStyle``, and defined for any year and for infinity).

:func:`decode` turns one such raw value into a Python value, or a ConfigError naming the column.
Each row is then judged alone, in Python, by the row judge (:mod:`periodic_manager.db.judge`) and
shown by :mod:`periodic_manager.db.view`.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from sqlalchemy import ColumnElement, FromClause, LargeBinary, Text, cast, extract, literal
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from periodic_manager.cron import ANCHOR_MAX, ANCHOR_MIN
from periodic_manager.db.column_types import UTCDateTime
from periodic_manager.db.models import jobs_table
from periodic_manager.errors import ConfigError
from periodic_manager.schedules.definition import UNKNOWN_START
from periodic_manager.schedules.rules import MAX_JSON_DEPTH, PendingJson

# The columns of a raw row, in this order: the id, then ``enabled``, then the content the
# manager judges, then ``effective_at`` (bookkeeping the manager reads, never a row error), then
# the columns only people read. The manager's cache and its RowError hash cover all but DISPLAY.
CONTENT = ("name", "spec", "timezone", "anchor", "task_type", "payload", "options")
# Who paused the row, when and why (migration 0009): shown by the API, never exported or imported.
PAUSED = ("paused_note", "paused_at", "paused_by")
DISPLAY = ("description", "created_at", "updated_at", *PAUSED)
FIELDS = ("id", "enabled", *CONTENT, "effective_at", *DISPLAY)
N_JUDGED = 3 + len(CONTENT)  # id, enabled, content, effective_at
EFFECTIVE = N_JUDGED - 1
_INSTANTS = frozenset({"anchor", "effective_at", "created_at", "updated_at", "paused_at"})
_JSON = frozenset({"payload", "options"})

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = 1_000_000
_MIN_US = (ANCHOR_MIN - _EPOCH) // timedelta(microseconds=1)
_MAX_US = (ANCHOR_MAX - _EPOCH) // timedelta(microseconds=1)
_RANGE = f"out-of-range: must be between {ANCHOR_MIN.date()} and {ANCHOR_MAX.date()} UTC"


# -- reading ------------------------------------------------------------------------------------


class stored_bytes(FunctionElement[bytes]):  # noqa: N801 - used like a SQL function
    """SQL: the stored bytes of a column, undecoded (SQLite), or the UTF-8 bytes of its text
    (MariaDB/MySQL). Not for PostgreSQL, whose typed values are read as they are."""

    type = LargeBinary()
    inherit_cache = True
    name = "stored_bytes"


@compiles(stored_bytes)
def _stored_sqlite(element: stored_bytes, compiler: Any, **kw: Any) -> str:
    return f"CAST({compiler.process(element.clauses, **kw)} AS BLOB)"


@compiles(stored_bytes, "mysql")
@compiles(stored_bytes, "mariadb")
def _stored_mysql(element: stored_bytes, compiler: Any, **kw: Any) -> str:
    return f"CAST(CONVERT({compiler.process(element.clauses, **kw)} USING utf8mb4) AS BINARY)"


def columns(sqlite: bool, *, display: bool = False) -> list[ColumnElement[Any]]:
    """The raw columns of a row (:data:`FIELDS` order; without DISPLAY unless asked)."""
    names = ("enabled", *CONTENT, "effective_at", *(DISPLAY if display else ()))
    return [jobs_table.c.id, *(column(sqlite, n) for n in names)]


def column(sqlite: bool, name: str, table: FromClause | None = None) -> ColumnElement[Any]:
    """One column of ``periodic_jobs`` (or of ``table``, which holds a row's columns under the
    same names) in its raw form (decode it with :func:`decode`)."""
    col = (table if table is not None else jobs_table).c[name]
    if name == "id":
        return col
    if name in _INSTANTS:
        return raw_instant(sqlite, col).label(name)
    if sqlite:
        # CAST AS BLOB returns the stored bytes (or the text form of a number) without any
        # decoding by the driver; NULL stays NULL.
        return stored_bytes(col).label(name)
    if name in _JSON:
        return cast(col, Text).label(name)
    return col


def raw_instant(sqlite: bool, col: ColumnElement[Any]) -> ColumnElement[Any]:
    """An instant column in its raw form: SQLite's stored bytes, PostgreSQL's epoch seconds as
    text (defined for any year and for infinity); decode it with :func:`decode`."""
    if sqlite:
        return stored_bytes(col)
    return cast(extract("epoch", col), Text)


def enabled_is(sqlite: bool, value: bool) -> ColumnElement[bool]:
    """SQL condition "``enabled`` is judged ``value``" (exactly what :func:`judge_enabled` says;
    a row whose ``enabled`` is neither matches neither)."""
    return bool_is(sqlite, jobs_table.c.enabled, value)


def bool_is(sqlite: bool, col: ColumnElement[Any], value: bool) -> ColumnElement[bool]:
    """SQL condition "the boolean column ``col`` is judged ``value``": PostgreSQL's boolean, on
    SQLite exactly 1 or 0 (:func:`judge_enabled`); any other stored value matches neither."""
    if sqlite:
        return stored_bytes(col) == literal(b"1" if value else b"0", LargeBinary)
    return col.is_(value)


def not_disabled(sqlite: bool) -> ColumnElement[bool]:
    """SQL condition for the rows a full read must judge: all but those surely disabled."""
    t = jobs_table.c
    col: ColumnElement[Any] = t.enabled
    if sqlite:
        # Any value but 0 must reach the judge: 1 is enabled, anything else ('yes', 2, a blob)
        # is a row error, reported rather than silently skipped.
        return col.is_distinct_from(literal(0))
    return col.is_not(False)


# -- decoding one column ------------------------------------------------------------------------


def decode(sqlite: bool, name: str, value: Any) -> Any:
    """The Python value of one raw column, or ConfigError naming it."""
    if value is None:
        return None
    if name == "enabled":
        return judge_enabled(sqlite, value)
    value = utf8(name, value)
    if name in _JSON:
        return json_value(name, value)
    if name in _INSTANTS:
        return sqlite_instant(name, value) if sqlite else epoch_instant(name, value)
    return value


def utf8(name: str, value: Any) -> Any:
    if type(value) is not bytes:
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(name, "not valid UTF-8 text") from None


def json_value(name: str, text: str | bytes | None) -> Any:
    """A JSON column read as text (bytes on SQLite); SQL NULL is JSON null."""
    if text is None:
        return None
    # Decoded here, not by json.loads, which would also take UTF-16 and UTF-32 bytes.
    text = utf8(name, text)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError and integers beyond Python's 4,300 digits;
        # RecursionError nesting beyond the interpreter's limit.
        raise ConfigError(name, f"not valid JSON: {short(str(exc))}") from None


def judge_enabled(sqlite: bool, value: Any) -> bool:
    """``enabled`` as stored: PostgreSQL's boolean, or on SQLite exactly 1 or 0 (what SQLAlchemy
    and SQLite's TRUE/FALSE write). Anything else is a ConfigError naming ``enabled``."""
    if isinstance(value, bool):
        return value
    if value == b"1":
        return True
    if value == b"0":
        return False
    shown = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    raise ConfigError("enabled", f"must be true or false (1 or 0), not {short(repr(shown))}")


def epoch_instant(name: str, text: str) -> datetime:
    """PostgreSQL's ``extract(epoch ...)`` text ("1704060000.123456", "-Infinity") -> instant."""
    whole, _, frac = text.partition(".")
    try:
        us = int(whole) * _US
        if frac:
            part = int((frac + "000000")[:6])
            us += -part if whole.startswith("-") else part
    except ValueError:
        try:  # an exponent form (PostgreSQL < 14 returns double precision)
            number = Decimal(text)
            if not number.is_finite():
                raise InvalidOperation
            us = int(number * _US)
        except InvalidOperation:
            raise ConfigError(name, f"not a finite instant: {short(text)}") from None
    if not _MIN_US <= us <= _MAX_US:
        raise ConfigError(name, _RANGE, code="out-of-range")
    return _EPOCH + timedelta(microseconds=us)


def sqlite_instant(name: str, text: str) -> datetime:
    """A timestamp as SQLite stores it. SQLAlchemy writes naive UTC text there (see
    ``UTCDateTime``), so a value without an offset is UTC; one with an offset is honoured."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(name, f"not an ISO 8601 timestamp: {short(repr(text))}") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    # Compared while still in its own offset: converting year 1 at +14:00 would overflow.
    if not ANCHOR_MIN <= value <= ANCHOR_MAX:
        raise ConfigError(name, _RANGE, code="out-of-range")
    return value.astimezone(UTC)


def short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def instant_or_none(sqlite: bool, value: Any) -> datetime | None:
    """A raw instant column read for bookkeeping: None when NULL or unreadable, never an error."""
    if value is None:
        return None
    try:
        instant: datetime = decode(sqlite, "effective_at", value)
    except ConfigError:
        return None
    return instant


def effective_at(sqlite: bool, value: Any) -> datetime:
    """The row's ``effective_at``: no slot at or before it is sent. NULL or unreadable means
    unknown (UNKNOWN_START: nothing in the past may be sent), never a row error."""
    instant = instant_or_none(sqlite, value)
    return UNKNOWN_START if instant is None else instant


# -- cells of the runtime tables ------------------------------------------------------------------
# pm_managers, pm_entries, pm_schedule_state and pm_runs are written by managers, and by anyone
# with SQL access: the API reads them raw too, and a cell it cannot read is unknown (None), never
# an error that fails the read of the others.


def raw(sqlite: bool, col: ColumnElement[Any]) -> ColumnElement[Any]:
    """A runtime table's column in a form the driver always delivers: instants as
    :func:`raw_instant`; on SQLite every other column as its stored bytes; PostgreSQL's text,
    integer and boolean columns as they are (the server enforces their types, and every value of
    them is a Python value)."""
    if isinstance(col.type, UTCDateTime):
        return raw_instant(sqlite, col)
    if sqlite:
        return stored_bytes(col)
    return col


def text_of(value: Any) -> str | None:
    """A raw text cell: text (bytes that are not UTF-8 shown with replacement characters)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def int_of(value: Any) -> int | None:
    """A raw integer cell; None when NULL or not an integer (SQLite: ``'many'``, ``1e400``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = text_of(value)
    if text is None or len(text) > 40:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def bool_of(sqlite: bool, value: Any) -> bool | None:
    """A raw boolean cell, judged as :func:`judge_enabled` judges ``enabled`` (None: neither)."""
    if value is None:
        return None
    try:
        return judge_enabled(sqlite, value)
    except ConfigError:
        return None


def plain_jsonb(text: Any, max_bytes: int, jsonb: bool) -> PendingJson | None:
    """PostgreSQL's text of a JSON document, when it can pass every payload check without
    being re-encoded now (the canonical form is made later, off a cold start's path).

    JSONB's text is at least as long as our canonical form (which drops the blank after each
    ``,`` and ``:``, and whose numbers and strings are never longer), so a text within the size
    limit is within it canonically too; fewer brackets than the depth limit cannot nest deeper;
    PostgreSQL refuses NUL, and a text with a ``\\u`` escape takes the exact path. When the
    column is of type jsonb (``jsonb``: checked once per provider), the text is valid JSON by
    construction, and only an integer longer than Python parses could still fail: a run of that
    many digits takes the exact path too. Otherwise the text is parsed. Either way the verdict is
    the one of the exact path; only the cost differs.
    """
    if type(text) is not str:
        return None
    n = len(text)  # a text this short cannot hold that many brackets or digits: not searched
    if n > max_bytes or (not text.isascii() and len(text.encode()) > max_bytes):
        return None
    if (n > MAX_JSON_DEPTH and text.count("[") + text.count("{") > MAX_JSON_DEPTH) or "\\u" in text:
        return None
    if jsonb:
        if _INT_DIGITS and n > _INT_DIGITS and _LONG_DIGITS.search(text):
            return None
    else:
        try:
            json.loads(text)
        except (ValueError, RecursionError):
            return None  # the exact path names the error
    return PendingJson(text)


# A run of more digits than Python parses as an integer (sys.get_int_max_str_digits(); 0: no limit).
_INT_DIGITS = sys.get_int_max_str_digits()
_LONG_DIGITS = re.compile("[0-9]{%d}" % (_INT_DIGITS + 1))  # noqa: UP031
