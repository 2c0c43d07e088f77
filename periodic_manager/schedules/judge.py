"""The judge of a schedule row: the one place that decides whether a row's fields make a
schedule, whoever wrote them (the API, a schedule file, a SQL statement or code), and if not,
which field is wrong, why, and with what code.

:meth:`Judge.__call__` (or :func:`judge`) takes the fields as untrusted values (a request body's
JSON values, a file's entry, columns decoded from a stored row) and returns the judged schedule
(:class:`Judged`) or the list of :class:`Problem`, in one fixed order: the first is what a
manager reports for the row (a row error names one field). Its callers only translate:

- :meth:`periodic_manager.schedules.definition.PeriodicTaskConfig.create` raises the first;
- the API (``api/rows.py``) answers a write with a 422 listing them (413 for ``too-large``);
- the row judge of stored rows (:mod:`periodic_manager.db.judge`) decodes the columns, asks this
  judge, and reports the first as the row's error; its memos subclass :class:`Judge`;
- import (:mod:`periodic_manager.schedules.files`) names the entry and the first problem.

The rules of each option, of JSON documents and of targets are in
:mod:`periodic_manager.schedules.rules`; the cron grammar in :mod:`periodic_manager.cron`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from periodic_manager import cron
from periodic_manager.errors import ConfigError
from periodic_manager.schedules import calendars as calendar_rules
from periodic_manager.schedules import rules
from periodic_manager.schedules.bounds import NO_BOUNDS
from periodic_manager.schedules.calendars import CalendarSpec, Exclusion
from periodic_manager.schedules.rules import DEFAULT_MAX_PAYLOAD_BYTES, PendingJson, check_text
from periodic_manager.schedules.slots import next_slot

# The fields of a row as it is written (the id and bookkeeping aside): the required ones, then
# the others with the value a field left out takes.
REQUIRED = ("name", "spec", "task_type")
DEFAULTS: dict[str, Any] = {
    "timezone": "UTC",
    "payload": None,
    "options": {},
    "enabled": True,
    "description": None,
    "anchor": None,
}
FIELDS = (*REQUIRED, *DEFAULTS)

NAME_MAX = 200  # the periodic_jobs.name column
NAME_RE = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9_.:/@-]{{0,{NAME_MAX - 1}}}\Z")
NAME_RULE = (
    "must be 1-200 characters: an ASCII letter or digit, then ASCII letters, digits, "
    "'_', '.', ':', '/', '@' or '-'"
)
TASK_TYPE_MAX = 200
SPEC_MAX = 200  # the periodic_jobs.spec column
ZONE_MAX = 64  # the periodic_jobs.timezone column (no IANA zone name is longer)
DESCRIPTION_MAX = 10_000  # the periodic_jobs.description column
MAX_EVERY_DAYS = 36_500  # @every at most ~100 years: its next slot is at most that far ahead
MAX_EVERY_US = MAX_EVERY_DAYS * 86_400 * 1_000_000
# options.jitter must stay under a cron spec's shortest gap among its first GAP_SLOTS slots after
# the fixed GAP_REFERENCE (every judge answers alike; schedules/jitter.py says why).
GAP_SLOTS = 64
GAP_REFERENCE = datetime(2001, 1, 1, tzinfo=cron.UTC)
MISSING = "missing"  # Problem.code of a required field left out


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a row is no schedule: the field (dotted inside options), the reason, and a
    machine-readable code (``value_error``, ``missing``, ``never-fires``, ``target-refuses``,
    ``too-large``, ...)."""

    field: str
    reason: str
    code: str = "value_error"

    def error(self) -> ConfigError:
        return ConfigError(self.field, self.reason, code=self.code)


@dataclass(frozen=True, slots=True)
class Deployment:
    """What a judge must know of where the row runs. ``targets``: the deployment's configured
    targets (``Settings.configured_targets()``; None: any known target, no task rules);
    ``calendars``: those ``options.exclude`` may name (None: not read, left unresolved);
    ``now``: a write, whose spec must fire after it (None: not asked, as for stored rows)."""

    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    targets: Collection[str] | None = None
    calendars: Mapping[str, CalendarSpec] | None = None
    now: datetime | None = None


@dataclass(slots=True)
class Judged:
    """A row's fields as judged: each value as it is kept (options as a dict and its canonical
    JSON, the payload as JSON text, the anchor as an instant) and the parsed schedule."""

    name: str
    spec: str
    task_type: str
    payload: str | PendingJson  # canonical JSON, or a document proven valid (PendingJson)
    options: dict[str, Any]
    options_json: str
    timezone: str
    anchor: datetime | None
    schedule: cron.Schedule
    exclusion: Exclusion | None
    enabled: bool
    description: str | None


_BAD: Any = object()  # a field found wrong: the checks that need it are not asked


class Judge:
    """The judge (see the module docstring). A judge holds its :class:`Deployment`; each step
    is a method so that a judge of many rows (``db.judge.RowJudge``) may remember verdicts on
    values rows repeat, never decide them otherwise."""

    def __init__(self, deployment: Deployment | None = None) -> None:
        self.deployment = deployment if deployment is not None else Deployment()

    def __call__(self, fields: Mapping[str, Any]) -> Judged | list[Problem]:
        problems: list[Problem] = []

        def ask(check: Callable[..., Any], *values: Any) -> Any:
            if any(v is _BAD for v in values):
                return _BAD
            try:
                return check(*values)
            except ConfigError as exc:
                problems.append(Problem(exc.field, exc.reason, exc.code))
            except Exception as exc:  # a value no rule foresaw: the row's problem, never a crash
                problems.append(Problem("row", f"unexpected {type(exc).__name__}: {exc}"))
            return _BAD

        given = self._complete(fields, problems)
        anchor = ask(anchor_of, given["anchor"])
        name = ask(self.name, given["name"])
        task_type = ask(self.task_type, given["task_type"])
        payload = ask(self.payload, given["payload"])
        options = ask(self.options, given["options"])
        opts, options_json = options if options is not _BAD else (_BAD, _BAD)
        schedule = ask(self.schedule, given["spec"], given["timezone"], anchor)
        ask(check_gap, schedule, opts)
        ask(self.target, opts)
        ask(self.task, task_type, payload, opts)
        exclusion = ask(self.exclusion, opts)
        enabled = ask(check_enabled, given["enabled"])
        description = ask(check_description, given["description"])
        if self.deployment.now is not None:
            ask(fires_after, schedule, self.deployment.now)
        if problems:
            return problems
        return Judged(
            name,
            given["spec"],
            task_type,
            payload,
            opts,
            options_json,
            given["timezone"],
            anchor,
            schedule,
            exclusion,
            enabled,
            description,
        )

    @staticmethod
    def _complete(fields: Mapping[str, Any], problems: list[Problem]) -> dict[str, Any]:
        """Every field: as given, its default, or _BAD (an unknown field, a required one left
        out: each a problem)."""
        unknown = sorted(str(key) for key in fields if key not in FIELDS)
        if unknown:
            known = ", ".join(FIELDS)
            problems.extend(Problem(key, f"unknown field (known: {known})") for key in unknown)
        given = {**DEFAULTS, **fields}
        for key in REQUIRED:
            if key not in fields:
                problems.append(Problem(key, "is required", MISSING))
                given[key] = _BAD
        return given

    # -- the steps ---------------------------------------------------------------------------

    def name(self, value: Any) -> str:
        if not isinstance(value, str) or not NAME_RE.match(value):
            raise ConfigError("name", NAME_RULE)
        return value

    def task_type(self, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise ConfigError("task_type", "must be a non-empty string")
        if len(value) > TASK_TYPE_MAX or not value.isprintable():
            raise ConfigError("task_type", f"must be at most {TASK_TYPE_MAX} printable characters")
        return value

    def payload(self, value: Any) -> str | PendingJson:
        """The payload's canonical JSON (a stored text proven valid may stay as it is)."""
        return rules.check_json("payload", value, self.deployment.max_payload_bytes)

    def options(self, value: Any) -> tuple[dict[str, Any], str]:
        if value is None:  # a stored row's NULL reads as {} (db.judge); a writer sends {}
            raise ConfigError("options", "must be a JSON object")
        return rules.checked_options(value, self.deployment.max_payload_bytes)

    def schedule(self, spec: Any, timezone: Any, anchor: datetime | None) -> cron.Schedule:
        return parse_schedule(spec, timezone, anchor)

    def target(self, options: Mapping[str, Any]) -> None:
        rules.validate_target(options, self.deployment.targets)

    def task(self, task_type: str, payload: str | PendingJson, options: Mapping[str, Any]) -> None:
        text = payload.text if isinstance(payload, PendingJson) else payload
        rules.validate_task(task_type, text, options, self.deployment.targets)

    def exclusion(self, options: Mapping[str, Any]) -> Exclusion | None:
        names = options.get("exclude")
        calendars = self.deployment.calendars
        if names is None or calendars is None:
            return None
        return calendar_rules.exclusion(names, calendars)


def judge(
    fields: Mapping[str, Any], deployment: Deployment | None = None
) -> Judged | list[Problem]:
    """The verdict of :class:`Judge` on one row's ``fields``."""
    return Judge(deployment)(fields)


def parse_schedule(spec: Any, timezone: Any, anchor: datetime | None) -> cron.Schedule:
    """Parse (spec, timezone, anchor); ConfigError names ``spec``, ``timezone`` or ``anchor``."""
    if not isinstance(spec, str):
        raise ConfigError("spec", "must be a string")
    if len(spec) > SPEC_MAX:
        raise ConfigError("spec", f"must be at most {SPEC_MAX} characters")
    if not isinstance(timezone, str) or not timezone:
        raise ConfigError("timezone", "must be an IANA zone name such as 'UTC' or 'Europe/Berlin'")
    check_text("timezone", timezone)  # a zone name becomes a file path
    if anchor is not None and (
        not isinstance(anchor, datetime) or anchor.tzinfo is None or anchor.utcoffset() is None
    ):
        raise ConfigError("anchor", "must be an instant with a UTC offset")
    try:
        schedule = cron.parse(spec, tz=timezone, anchor=anchor)
    except cron.CronError as exc:
        if exc.field in ("timezone", "anchor"):
            raise ConfigError(exc.field, exc.reason, code=exc.code) from None
        raise ConfigError("spec", str(exc), code=exc.code) from None
    if isinstance(schedule, cron.EverySchedule) and schedule.spec.period_us > MAX_EVERY_US:
        raise ConfigError(
            "spec",
            f"every-duration: an @every interval may be at most {MAX_EVERY_DAYS}d",
            code="every-duration",
        )
    return schedule


def anchor_of(value: Any) -> datetime | None:
    """An anchor given as an instant or as ISO 8601 text (a body, a file), with a UTC offset."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
    if isinstance(value, datetime) and value.tzinfo is not None and value.utcoffset() is not None:
        return value
    raise ConfigError("anchor", "must be an ISO 8601 instant with a UTC offset")


def check_enabled(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError("enabled", "must be true or false")
    return value


def check_description(value: Any) -> str | None:
    """Read by people only: any one text up to the column's length (or none)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError("description", "must be a string")
    if len(value) > DESCRIPTION_MAX:
        raise ConfigError("description", f"must be at most {DESCRIPTION_MAX} characters")
    check_text("description", value)
    return value


def fires_after(schedule: cron.Schedule, now: datetime) -> None:
    """A write's spec must fire after ``now`` (a schedule whose options.end_at has passed is
    valid: ended)."""
    try:
        found = next_slot(schedule, now, NO_BOUNDS)
    except (OverflowError, ValueError, ArithmeticError):
        found = None  # no slot before year 10000
    if found is None:
        raise ConfigError("spec", "has no fire time after now")


@lru_cache(maxsize=4096)
def shortest_gap(schedule: cron.Schedule) -> timedelta | None:
    """The schedule's shortest gap between slots (see GAP_SLOTS), or None when it has fewer
    than two slots after the reference (no gap to stay under)."""
    if isinstance(schedule, cron.EverySchedule):
        return timedelta(microseconds=schedule.spec.period_us)
    gap: timedelta | None = None
    try:
        prev = schedule.next_after(GAP_REFERENCE)
        for _ in range(GAP_SLOTS - 1):
            at = schedule.next_after(prev)
            if gap is None or at - prev < gap:
                gap = at - prev
            prev = at
    except (OverflowError, ValueError, ArithmeticError):
        pass  # fewer slots: the gaps found so far
    return gap


def check_gap(schedule: cron.Schedule, options: Mapping[str, Any] | None) -> None:
    """ConfigError naming ``options.jitter`` when it is not less than the shortest gap."""
    if not options or "jitter" not in options:
        return
    jitter = options["jitter"]  # checked by the option table: a number within bounds
    gap = shortest_gap(schedule)
    if gap is not None and jitter * 1_000_000 >= gap // timedelta(microseconds=1):
        raise ConfigError(
            "options.jitter",
            f"must be less than the schedule's shortest gap between slots "
            f"({gap.total_seconds():g} s)",
        )
