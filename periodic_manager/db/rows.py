"""``periodic_jobs`` rows as untrusted data: one reader, one judge, for the manager, the API and
the export.

Anyone with SQL access writes these rows, so no column may be interpreted by the driver, where
one bad value fails the whole query (an anchor in year 10000 or BC on PostgreSQL, non-UTF-8
bytes or a non-ISO timestamp on SQLite, ...). :func:`columns` selects every column in a form the
driver always delivers:

- SQLite: ``CAST(column AS BLOB)``: the stored bytes (or the text form of a number), undecoded.
- PostgreSQL: text and boolean columns as they are (the server enforces their type and
  encoding), JSONB as text, timestamps as the text of their epoch seconds (independent of the
  session's ``TimeZone`` and ``DateStyle``, and defined for any year and for infinity).

Each row is then judged alone, in Python, by one function: :func:`judge` (the manager's provider
and the API's trigger) and :func:`view` (the API's and the export's reading of a row) both build
on :func:`judge_enabled` and :func:`judge_content`, so the manager, the API and the export agree
on whether a row is enabled and whether it is usable, and name the same field when it is not.
The judge is a plain function over the raw values: no ORM objects, nothing encoded twice.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from sqlalchemy import ColumnElement, LargeBinary, Table, Text, cast, extract, literal
from sqlalchemy.sql.elements import ColumnClause

from periodic_manager.contracts import RowError
from periodic_manager.cron import ANCHOR_MAX, ANCHOR_MIN
from periodic_manager.db.models import PeriodicJob
from periodic_manager.errors import ConfigError
from periodic_manager.schedules.definition import UNKNOWN_START, PendingJson, PeriodicTaskConfig
from periodic_manager.schedules.rules import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_JSON_DEPTH,
    NAME_RE,
    check_json,
    checked_options,
    validate_name,
    validate_payload,
    validate_schedule,
    validate_task_type,
)

# The columns of a raw row, in this order: the id, then ``enabled``, then the content the
# manager judges, then ``effective_at`` (bookkeeping the manager reads, never a row error), then
# the columns only people read. The manager's cache and its RowError hash cover all but DISPLAY.
CONTENT = ("name", "spec", "timezone", "anchor", "task_type", "payload", "options")
DISPLAY = ("description", "created_at", "updated_at")
FIELDS = ("id", "enabled", *CONTENT, "effective_at", *DISPLAY)
N_JUDGED = 3 + len(CONTENT)  # id, enabled, content, effective_at
_EFFECTIVE = N_JUDGED - 1
_INSTANTS = frozenset({"anchor", "effective_at", "created_at", "updated_at"})
_JSON = frozenset({"payload", "options"})

Check = Callable[[PeriodicTaskConfig], None]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = 1_000_000
_MIN_US = (ANCHOR_MIN - _EPOCH) // timedelta(microseconds=1)
_MAX_US = (ANCHOR_MAX - _EPOCH) // timedelta(microseconds=1)
_RANGE = f"out-of-range: must be between {ANCHOR_MIN.date()} and {ANCHOR_MAX.date()} UTC"


# -- reading ------------------------------------------------------------------------------------


def columns(sqlite: bool, *, display: bool = False) -> list[ColumnElement[Any]]:
    """The raw columns of a row (:data:`FIELDS` order; without DISPLAY unless asked)."""
    names = ("enabled", *CONTENT, "effective_at", *(DISPLAY if display else ()))
    return [PeriodicJob.__table__.c.id, *(column(sqlite, n) for n in names)]


def column(sqlite: bool, name: str, table: Table | None = None) -> ColumnElement[Any]:
    """One column of ``periodic_jobs`` (or of ``table``, which holds a row's columns under the
    same names) in its raw form (decode it with :func:`decode`)."""
    col = (table if table is not None else PeriodicJob.__table__).c[name]
    if name == "id":
        return col
    if name in _INSTANTS:
        return raw_instant(sqlite, col).label(name)
    if sqlite:
        # CAST AS BLOB returns the stored bytes (or the text form of a number) without any
        # decoding by the driver; NULL stays NULL.
        return cast(col, LargeBinary).label(name)
    if name in _JSON:
        return cast(col, Text).label(name)
    return col


def raw_instant(sqlite: bool, col: ColumnElement[Any]) -> ColumnElement[Any]:
    """An instant column in its raw form: SQLite's stored bytes, PostgreSQL's epoch seconds as
    text (defined for any year and for infinity); decode it with :func:`decode`."""
    if sqlite:
        return cast(col, LargeBinary)
    return cast(extract("epoch", col), Text)


def enabled_is(sqlite: bool, value: bool) -> ColumnElement[bool]:
    """SQL condition "``enabled`` is judged ``value``" (exactly what :func:`judge_enabled` says;
    a row whose ``enabled`` is neither matches neither)."""
    t = PeriodicJob.__table__.c
    if sqlite:
        return cast(t.enabled, LargeBinary) == literal(b"1" if value else b"0", LargeBinary)
    return t.enabled.is_(value)


def not_disabled(sqlite: bool) -> ColumnElement[bool]:
    """SQL condition for the rows a full read must judge: all but those surely disabled."""
    t = PeriodicJob.__table__.c
    col: ColumnClause[Any] = t.enabled
    if sqlite:
        # Any value but 0 must reach the judge: 1 is enabled, anything else ('yes', 2, a blob)
        # is a row error, reported rather than silently skipped.
        return col.is_not(literal(0))
    return col.is_not(False)


# -- decoding one column ------------------------------------------------------------------------


def decode(sqlite: bool, name: str, value: Any) -> Any:
    """The Python value of one raw column, or ConfigError naming it."""
    if value is None:
        return None
    if name == "enabled":
        return judge_enabled(sqlite, value)
    value = _utf8(name, value)
    if name in _JSON:
        return _json(name, value)
    if name in _INSTANTS:
        return _sqlite_instant(name, value) if sqlite else _epoch_instant(name, value)
    return value


def _utf8(name: str, value: Any) -> Any:
    if type(value) is not bytes:
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(name, "not valid UTF-8 text") from None


def _json(name: str, text: str | bytes | None) -> Any:
    """A JSON column read as text (bytes on SQLite); SQL NULL is JSON null."""
    if text is None:
        return None
    # Decoded here, not by json.loads, which would also take UTF-16 and UTF-32 bytes.
    text = _utf8(name, text)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError and integers beyond Python's 4,300 digits;
        # RecursionError nesting beyond the interpreter's limit.
        raise ConfigError(name, f"not valid JSON: {_short(str(exc))}") from None


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
    raise ConfigError("enabled", f"must be true or false (1 or 0), not {_short(repr(shown))}")


def _epoch_instant(name: str, text: str) -> datetime:
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
            raise ConfigError(name, f"not a finite instant: {_short(text)}") from None
    if not _MIN_US <= us <= _MAX_US:
        raise ConfigError(name, _RANGE, code="out-of-range")
    return _EPOCH + timedelta(microseconds=us)


def _sqlite_instant(name: str, text: str) -> datetime:
    """A timestamp as SQLite stores it. SQLAlchemy writes naive UTC text there (see
    ``UTCDateTime``), so a value without an offset is UTC; one with an offset is honoured."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(name, f"not an ISO 8601 timestamp: {_short(repr(text))}") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    # Compared while still in its own offset: converting year 1 at +14:00 would overflow.
    if not ANCHOR_MIN <= value <= ANCHOR_MAX:
        raise ConfigError(name, _RANGE, code="out-of-range")
    return value.astimezone(UTC)


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- judging a row -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rules:
    """How rows are judged in one deployment: the backend, the size limit of payload and
    options, and an optional deployment check (e.g. an unconfigured ``options.target``)."""

    sqlite: bool
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    check: Check | None = None


def judge_content(rules: Rules, raw: Sequence[Any]) -> PeriodicTaskConfig | RowError:
    """The config of a raw row (``enabled`` aside), or the RowError naming its first bad field.

    Never raises: whatever a row holds, the others go on.
    """
    row_id = raw[0]
    name, spec, timezone, anchor, task_type, payload, options = raw[2:_EFFECTIVE]
    try:
        # decode() column by column, unrolled: this runs for every row of a full read.
        if rules.sqlite:
            name, spec = _utf8("name", name), _utf8("spec", spec)
            timezone, task_type = _utf8("timezone", timezone), _utf8("task_type", task_type)
            if anchor is not None:
                anchor = _sqlite_instant("anchor", _utf8("anchor", anchor))
        elif anchor is not None:
            anchor = _epoch_instant("anchor", anchor)
        payload, options = _json("payload", payload), _json("options", options)
        config = PeriodicTaskConfig.create(
            effective_at=effective_at(rules.sqlite, raw[_EFFECTIVE]),
            name=name,
            spec=spec,
            task_type=task_type,
            payload=payload,
            options=options,
            timezone=timezone,
            anchor=anchor,
            schedule_id=row_id,
            max_payload_bytes=rules.max_payload_bytes,
        )
        if rules.check is not None:
            rules.check(config)
        return config
    except ConfigError as exc:
        field, reason, code = exc.field, exc.reason, exc.code
    except Exception as exc:
        # A row must never stop the others, even if it trips something unforeseen in the
        # validators: report it like any bad row.
        field, reason, code = "row", f"unexpected {type(exc).__name__}: {exc}", "value_error"
    return _row_error(raw, field, reason, code)


def judge(rules: Rules, raw: Sequence[Any]) -> PeriodicTaskConfig | RowError | None:
    """What the manager does with a raw row: None when it is disabled (nothing to schedule),
    else its config or the RowError to report (a bad ``enabled`` is reported, never skipped)."""
    try:
        if not judge_enabled(rules.sqlite, raw[1]):
            return None
    except ConfigError as exc:
        return _row_error(raw, exc.field, exc.reason, exc.code)
    return judge_content(rules, raw)


def _plain_jsonb(text: Any, max_bytes: int, jsonb: bool) -> PendingJson | None:
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


class RowJudge:
    """:func:`judge` for a provider reading many rows: the same verdicts, field for field, but
    what rows repeat is decoded and checked once (a spec in its zone, a task type, an options
    text, an ``effective_at``), and the repeated strings are shared, not copied per row.

    ``raw[N_JUDGED]``, when present, is the row's revision, kept on its config.
    """

    MEMO_MAX = 100_000  # distinct values remembered per kind (then forgotten and relearned)

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        # What valid rows become: a PeriodicTaskConfig, or a subclass a manager adopts as is
        # (its scheduler's entries: one object per schedule from the read on, never a copy).
        self.config_class: type[PeriodicTaskConfig] = PeriodicTaskConfig
        self.jsonb = False  # the payload column is of type jsonb (its text is valid JSON)
        self._strings: dict[str, str] = {}
        self._task_types: dict[str, ConfigError | None] = {}
        self._schedules: dict[tuple[str, str], ConfigError | None] = {}
        self._options: dict[Any, tuple[Any, str] | ConfigError] = {}  # raw text -> verdict
        self._instants: dict[Any, datetime] = {}
        # (spec, timezone, task_type, options text) of valid rows -> their shared values
        self._shapes: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def __call__(self, raw: Sequence[Any]) -> PeriodicTaskConfig | RowError | None:
        try:
            if not judge_enabled(self.rules.sqlite, raw[1]):
                return None
        except ConfigError as exc:
            return _row_error(raw, exc.field, exc.reason, exc.code)
        try:
            return self._content(raw)
        except ConfigError as exc:
            return _row_error(raw, exc.field, exc.reason, exc.code)
        except Exception as exc:
            # A row must never stop the others (see judge_content).
            return _row_error(raw, "row", f"unexpected {type(exc).__name__}: {exc}", "value_error")

    def _content(self, raw: Sequence[Any]) -> PeriodicTaskConfig:
        rules = self.rules
        name, spec, timezone, anchor, task_type, payload_raw, options_raw = raw[2:_EFFECTIVE]
        if anchor is None and not rules.sqlite:
            # A row like one already found valid in all but its name and payload: only those
            # two are checked (if either fails, the full path below names the error).
            known = self._shapes.get((spec, timezone, task_type, options_raw))
            if known is not None and type(name) is str and NAME_RE.match(name):
                pending = _plain_jsonb(payload_raw, rules.max_payload_bytes, self.jsonb)
                if pending is not None:
                    spec, timezone, task_type, opts, options_json = known
                    config = self.config_class.of_row(
                        name, spec, task_type, opts, options_json, timezone, None, raw[0],
                        self._effective_at(raw[_EFFECTIVE]), pending,
                        raw[N_JUDGED] if len(raw) > N_JUDGED else None,
                    )
                    if rules.check is not None:
                        rules.check(config)
                    return config
        config = self._full(raw, name, spec, timezone, anchor, task_type, payload_raw, options_raw)
        if anchor is None and not rules.sqlite:
            self._remember(
                self._shapes,
                (raw[3], raw[4], raw[6], options_raw),
                (config.spec, config.timezone, config.task_type, config.options, config.options_json),
            )
        return config

    def _full(
        self,
        raw: Sequence[Any],
        name: Any,
        spec: Any,
        timezone: Any,
        anchor: Any,
        task_type: Any,
        payload_raw: Any,
        options_raw: Any,
    ) -> PeriodicTaskConfig:
        """Every column decoded and checked, in judge_content's order."""
        rules = self.rules
        # Decoding, in column order (as judge_content, so the same field is named first).
        if rules.sqlite:
            name = _utf8("name", name)
            spec, timezone = self._text("spec", spec), self._text("timezone", timezone)
            if anchor is not None:
                anchor = _sqlite_instant("anchor", _utf8("anchor", anchor))
            task_type = self._text("task_type", task_type)
        else:
            spec, timezone = self._text("spec", spec), self._text("timezone", timezone)
            if anchor is not None:
                anchor = _epoch_instant("anchor", anchor)
            task_type = self._text("task_type", task_type)
        pending = (
            None if rules.sqlite else _plain_jsonb(payload_raw, rules.max_payload_bytes, self.jsonb)
        )
        if pending is None:
            payload = _json("payload", payload_raw)
        options = self._options.get(options_raw)
        if options is None:
            parsed = _json("options", options_raw)  # a decoding error is raised here, in order
        # Checks, in PeriodicTaskConfig.create's order.
        validate_name(name)
        self._memo(self._task_types, task_type, validate_task_type)
        payload_json: str | PendingJson = (
            pending if pending is not None else validate_payload(payload, rules.max_payload_bytes)
        )
        if options is None:
            try:
                options = checked_options(parsed, rules.max_payload_bytes)
            except ConfigError as exc:
                options = exc
            self._remember(self._options, options_raw, options)
        if isinstance(options, ConfigError):
            raise options
        opts, options_json = options
        if anchor is None:
            self._memo(self._schedules, (spec, timezone), lambda st: validate_schedule(*st, None))
        else:
            validate_schedule(spec, timezone, anchor)
        config = self.config_class(
            name,
            spec,
            task_type,
            options=opts,
            timezone=timezone,
            anchor=anchor,
            schedule_id=raw[0],
            effective_at=self._effective_at(raw[_EFFECTIVE]),
            payload_json=payload_json,
            options_json=options_json,
            revision=raw[N_JUDGED] if len(raw) > N_JUDGED else None,
        )
        if rules.check is not None:
            rules.check(config)
        return config

    def _text(self, name: str, value: Any) -> Any:
        """A text column, decoded and shared with every row that holds the same text."""
        if type(value) is not str:
            value = _utf8(name, value)
            if type(value) is not str:
                return value  # None or another type: the checks name it
        shared = self._strings.get(value)
        if shared is None:
            self._remember(self._strings, value, value)
            return value
        return shared

    def _memo(self, memo: dict[Any, ConfigError | None], value: Any, check: Callable[[Any], Any]) -> None:
        try:
            verdict = memo[value]
        except KeyError:
            try:
                check(value)
                verdict = None
            except ConfigError as exc:
                verdict = exc
            except TypeError:  # unhashable or odd: checked, not remembered
                raise
            self._remember(memo, value, verdict)
        if verdict is not None:
            raise verdict

    def _effective_at(self, value: Any) -> datetime:
        instant = self._instants.get(value)
        if instant is None:
            instant = effective_at(self.rules.sqlite, value)
            if value is not None:
                self._remember(self._instants, value, instant)
        return instant

    def _remember(self, memo: dict[Any, Any], key: Any, value: Any) -> None:
        if len(memo) >= self.MEMO_MAX:
            memo.clear()
        memo[key] = value


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
    if value is None:
        return UNKNOWN_START
    try:
        instant: datetime = decode(sqlite, "effective_at", value)
    except ConfigError:
        return UNKNOWN_START
    return instant


def _row_error(raw: Sequence[Any], field: str, reason: str, code: str) -> RowError:
    name = raw[2]
    if isinstance(name, bytes):  # name the row in the error if its name is text at all
        name = name.decode("utf-8", errors="replace")
    revision = raw[N_JUDGED] if len(raw) > N_JUDGED else None
    return RowError(
        schedule_id=raw[0],
        name=name if isinstance(name, str) else None,
        content_hash=raw_hash(raw[:N_JUDGED]),
        field=field,
        reason=reason,
        code=code,
        revision=revision if type(revision) is int else None,
    )


def raw_hash(raw: Sequence[Any]) -> str:
    """sha256 of raw column values: changes whenever any of them changes."""
    doc = [_raw_repr(v) for v in raw]
    return hashlib.sha256(json.dumps(doc, ensure_ascii=True).encode()).hexdigest()


def _raw_repr(value: Any) -> Any:
    if value is None or isinstance(value, str | int):  # bool is an int
        return value
    if isinstance(value, bytes):
        return "x:" + value.hex()
    return repr(value)


# -- a row as people see it ----------------------------------------------------------------------


@dataclass(slots=True)
class RowView:
    """A row decoded for display. ``values`` holds every column of :data:`FIELDS` but the id,
    None where the column cannot be read (``options``: {} then); ``errors`` says why, the
    judge's verdict first. ``config`` is the usable config, or None."""

    id: int
    values: dict[str, Any]
    errors: list[tuple[str, str]]
    config: PeriodicTaskConfig | None
    unreadable: dict[str, str] = field(default_factory=dict)  # column -> why it reads as None
    raw: tuple[Any, ...] = ()

    @property
    def enabled(self) -> bool | None:
        return self.values["enabled"]

    @property
    def usable(self) -> bool:
        """Whether a manager would schedule the row were it enabled: its content is a config
        and its ``enabled`` is true or false."""
        return self.config is not None and "enabled" not in self.unreadable

    @property
    def etag(self) -> str:
        """A strong validator of this version: the hash of every raw column."""
        return '"' + raw_hash(self.raw)[:32] + '"'


def view(rules: Rules, raw: Sequence[Any]) -> RowView:
    """The row as the API and the export show it, judged exactly as the manager judges it.

    ``errors`` lists, in this order: a bad ``enabled``; the content's verdict (what a manager
    reports for the row when it is enabled; paused rows are judged too, since resuming them
    needs it); then each further column that cannot be read (shown as None). Only the first two
    kinds make a row unusable; a bad ``description`` or timestamp does not.
    """
    raw = tuple(raw)
    values: dict[str, Any] = {}
    unreadable: dict[str, str] = {}
    for name, value in zip(FIELDS[1:], raw[1:], strict=False):
        try:
            values[name] = decode(rules.sqlite, name, value)
        except ConfigError as exc:
            values[name] = None
            if name != "effective_at":  # unknown, not an error (see effective_at())
                unreadable[name] = exc.reason
    verdict = judge_content(rules, raw)
    config = verdict if isinstance(verdict, PeriodicTaskConfig) else None
    if config is not None:
        # The judge's own values: options normalised (JSON null reads as {}), JSON checked.
        values["payload"], values["options"] = config.payload, dict(config.options)
    else:
        _safe_json(rules, values, unreadable)
    errors: dict[str, str] = {}  # field -> reason, in insertion order, one item per field
    if "enabled" in unreadable:
        errors["enabled"] = unreadable["enabled"]
    if isinstance(verdict, RowError):
        errors.setdefault(verdict.field, verdict.reason)
    for name, reason in unreadable.items():
        errors.setdefault(name, reason)
    return RowView(raw[0], values, list(errors.items()), config, unreadable, raw)


def _safe_json(rules: Rules, values: dict[str, Any], unreadable: dict[str, str]) -> None:
    """Show a JSON column of an unusable row only if any client can take it: within the size
    and depth limits (else None / {}, and the column is unreadable); options as an object."""
    for name in ("payload", "options"):
        if name in unreadable:
            continue
        try:
            check_json(name, values[name], rules.max_payload_bytes)
        except ConfigError as exc:
            values[name] = None
            unreadable[name] = exc.reason
    options = values["options"]
    if not isinstance(options, dict):
        if options is not None and "options" not in unreadable:  # JSON null reads as {}
            unreadable["options"] = "must be a JSON object"
        values["options"] = {}
