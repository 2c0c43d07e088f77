"""Rows as stored, in schedule files: the columns of a row ``export`` writes as they are, and how
``import`` writes them back, byte for byte.

A row the API shows with ``errors`` (the manager rejects it, or a column of it cannot be read) is
not a schedule anyone could import as a desired state, yet a backup must restore it as it was,
still invalid and still visible. ``export`` therefore writes such a row marked
``invalid: "<field>: <reason>"`` (the API's first error for it), every column that can be read as
its value, as stored (unjudged), and every column that cannot in ``raw``, as the stored text. A
``raw`` value is a string (the stored text) or ``{"hex": "..."}``: bytes that are not UTF-8, or
(SQLite) a value stored as a BLOB, so that it is stored as one again. PostgreSQL instants are given
as their text in UTC and ISO style (``10000-01-01 00:00:00+00``, ``infinity``).

``import`` writes an entry so marked as stored, without judging it: values of the right type for
their column, ``raw`` columns as given (SQLite: text as text, hex as a BLOB; PostgreSQL: cast to
the column's type). The marker is the file's word that this is a stored row, nothing more: the
manager and the API judge the row again when they read it. What a backend cannot hold at all
(bytes that are not UTF-8, a NUL character, a ``raw`` boolean or non-JSON text on PostgreSQL) is
refused, naming the entry and the field, before anything is written.

This module is the files' side; reading each column's stored form and writing it back is
:mod:`periodic_manager.db.stored`'s (through the schedule writer).
"""

from __future__ import annotations

import json
import re
from typing import Any

from periodic_manager.db.stored import COLUMNS, JSON_COLUMNS, Raw, StoredRow, column_length
from periodic_manager.errors import ConfigError
from periodic_manager.schedules.rules import canonical_json

MARK = "invalid"
RAW = "raw"
TEXTS = ("name", "spec", "task_type", "timezone", "description")


# -- a stored row in a file ----------------------------------------------------------------------


def row_identity(row: StoredRow) -> tuple[str, Any]:
    """What names a stored row in a file: its name, or the bytes of a name that is not text."""
    name = row.view.values["name"]
    if name is not None:
        return "name", name
    stored = row.raw("name")
    return "raw", stored[0] if stored is not None else None


def file_form(raw: Raw) -> str | dict[str, str]:
    """How a file carries a stored value: its text, or ``{"hex": ...}``."""
    data, blob = raw
    if not blob:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return {"hex": data.hex()}


def shown(raw: Raw) -> str:
    """A stored value in an import's plan: ``<raw 'text'>`` or ``<raw hex ...>``."""
    form = file_form(raw)
    return f"<raw {form!r}>" if isinstance(form, str) else f"<raw hex {form['hex']}>"


# -- checking an entry ----------------------------------------------------------------------------


def parse_raw(column: str, value: Any) -> Raw:
    """A ``raw`` value of a file, or ConfigError naming ``raw.<column>``."""
    where = f"{RAW}.{column}"
    if column not in COLUMNS:
        raise ConfigError(where, f"not a column a file may give as stored ({', '.join(COLUMNS)})")
    if isinstance(value, str):
        try:
            return value.encode("utf-8"), False
        except UnicodeEncodeError:
            raise ConfigError(where, "must be valid Unicode (unpaired surrogate)") from None
    if isinstance(value, dict) and set(value) == {"hex"} and isinstance(value["hex"], str):
        try:
            return bytes.fromhex(value["hex"]), True
        except ValueError:
            raise ConfigError(where, "hex: must be pairs of hexadecimal digits") from None
    raise ConfigError(where, 'must be the stored text, or {"hex": "<bytes in hexadecimal>"}')


def identity(entry: dict[str, Any]) -> tuple[str, Any]:
    """What names an entry: its ``name``, or the stored bytes of a name given in ``raw`` (as text
    when they are text, so it matches the row it was read from)."""
    if "name" in entry:
        return "name", entry["name"]
    data, _ = entry[RAW]["name"]
    try:
        return "name", data.decode("utf-8")
    except UnicodeDecodeError:
        return "raw", data


def check_json_value(field: str, value: Any) -> None:
    """A value a JSON column can hold (no NaN, nothing but JSON types), however odd."""
    try:
        canonical_json(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(field, f"must be a JSON value: {exc}") from None


def check_storable(entry: dict[str, Any], database: str) -> None:
    """Refuse what the backend (``postgresql``, ``sqlite``, ``mysql``) cannot hold (ConfigError
    naming the field): everything SQLite stores goes; PostgreSQL holds UTF-8 text without NUL,
    JSON in jsonb, booleans, and texts no longer than their columns; MariaDB/MySQL hold UTF-8
    text (JSON columns any text), ``enabled`` a TINYINT, texts no longer than their columns."""
    if database == "sqlite":
        return
    if database == "mysql":
        _check_mysql(entry)
        return
    for column, (data, blob) in entry.get(RAW, {}).items():
        where = f"{RAW}.{column}"
        if blob:
            raise ConfigError(
                where, "bytes given in hex cannot be stored in PostgreSQL (UTF-8 text)"
            )
        try:
            stored = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(where, "not UTF-8, which PostgreSQL cannot store") from None
        if column == "enabled":
            raise ConfigError(where, "a PostgreSQL boolean holds only true or false")
        if "\x00" in stored or (column in JSON_COLUMNS and "\\u0000" in stored):
            raise ConfigError(where, "PostgreSQL cannot store NUL characters")
        if column in JSON_COLUMNS and not _json_text(stored):
            raise ConfigError(where, "not JSON, which a PostgreSQL jsonb column cannot hold")
        _check_length(column, stored, where)
    for column in TEXTS:
        value = entry.get(column)
        if isinstance(value, str):
            if "\x00" in value:
                raise ConfigError(column, "PostgreSQL cannot store NUL characters")
            _check_length(column, value, column)
    for column in JSON_COLUMNS:
        if column in entry and "\\u0000" in canonical_json(entry[column]):
            raise ConfigError(column, "PostgreSQL cannot store NUL characters")


def _check_mysql(entry: dict[str, Any]) -> None:
    for column, (data, blob) in entry.get(RAW, {}).items():
        where = f"{RAW}.{column}"
        if blob:
            raise ConfigError(
                where, "bytes given in hex cannot be stored in MariaDB/MySQL (UTF-8 text)"
            )
        try:
            stored = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(
                where, "not UTF-8, which these MariaDB/MySQL columns cannot store"
            ) from None
        if column == "enabled" and not (_TINYINT.fullmatch(stored) and -128 <= int(stored) <= 127):
            raise ConfigError(
                where, "a MariaDB/MySQL TINYINT holds only whole numbers from -128 to 127"
            )
        _check_length(column, stored, where)
    for column in TEXTS:
        value = entry.get(column)
        if isinstance(value, str):
            _check_length(column, value, column)


_TINYINT = re.compile(r"-?[0-9]{1,3}")


def _check_length(column: str, value: str, where: str) -> None:
    limit = column_length(column)
    if limit is not None and len(value) > limit:
        raise ConfigError(where, f"longer than the column's {limit} characters")


def _json_text(stored: str) -> bool:
    """Whether ``stored`` is JSON text as PostgreSQL reads it: numbers of any length, no NaN or
    Infinity. Too deep for Python to tell: left to the database."""
    try:
        json.loads(stored, parse_int=str, parse_float=str, parse_constant=_no_constant)
    except RecursionError:
        return True
    except ValueError:
        return False
    return True


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def raws_of(entry: dict[str, Any]) -> dict[str, Raw]:
    """The columns an entry gives as stored (none for an entry that is not marked)."""
    out: dict[str, Raw] = entry.get(RAW, {})
    return out
