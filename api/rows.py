"""Schedule rows <-> API bodies: judging rows with the shared judge, validating a (merged) row
before it is written, and its upcoming slots.

Every route that reads a row reads it raw (``periodic_manager.db.schedule_reader``) and judges it
as the manager does (``periodic_manager.db.judge``), so no stored value can fail a request, and
``errors`` of a schedule is the manager's own verdict on it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any, Literal

from fastapi import Request

from periodic_manager.db import calendars as dbcalendars
from periodic_manager.db import judge as dbjudge
from periodic_manager.db import rows as dbrows
from periodic_manager.db import view as dbview
from periodic_manager.db.engine import Connection, reads_bytes
from periodic_manager.errors import ConfigError
from periodic_manager.schedules import calendars as calendar_rules
from periodic_manager.schedules import runs as slot_runs
from periodic_manager.schedules import slots
from periodic_manager.schedules.calendars import CalendarSpec
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.rules import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    TOO_LARGE,
    check_text,
)

from .errors import ApiProblem, config_error_item
from .schemas import Schedule, ScheduleError, ScheduleWithRuns
from .state import state_of

NEXT_RUNS = 3
Status = Literal["active", "paused", "error", "ended"]
# Errors a stored row (possibly written with SQL) can raise while its slots are computed.
SLOT_ERRORS = (ValueError, TypeError, ArithmeticError, LookupError, StopIteration)
# Fields of a row as the API writes them (the id and timestamps aside).
COLUMNS = (
    "name",
    "spec",
    "timezone",
    "task_type",
    "payload",
    "options",
    "enabled",
    "description",
    "anchor",
)


# -- reading -------------------------------------------------------------------------------------


async def rules(request: Request, conn: Connection) -> dbjudge.Rules:
    """How this deployment judges rows: backend, size limit, configured targets, and the
    calendars options.exclude may name (read now, as the manager reads them at a sync)."""
    settings = state_of(request.app).settings
    return dbjudge.rules_for(
        reads_bytes(conn), settings.max_payload_bytes, settings.configured_targets()
    ).with_calendars(await dbcalendars.specs(conn))


# -- validating a write ------------------------------------------------------------------------


def validate_row(
    fields: dict[str, Any],
    now: datetime,
    *,
    targets: Collection[str] | None = None,
    max_payload_bytes: int | None = None,
    calendars: Mapping[str, CalendarSpec] | None = None,
) -> PeriodicTaskConfig:
    """Validate a complete row (a new one or the merge of a PATCH) exactly as the manager would,
    and check that it fires at least once after ``now``. Raises ConfigError naming the field
    (code ``too-large`` for a payload or options over ``max_payload_bytes``).

    ``targets``: the targets the deployment runs (``Settings.configured_targets()``); a row whose
    ``options.target`` names another is refused, as the manager would refuse it at sync time.
    ``calendars``: those ``options.exclude`` may name (one it names that is not there: refused).
    """
    for name, value in fields.items():
        if isinstance(value, dbview.Unreadable):
            raise ConfigError(name, f"the stored value cannot be used ({value.reason}); send one")
    for name in ("name", "spec", "timezone", "task_type", "description"):
        if isinstance(fields.get(name), str):
            check_text(name, fields[name])
    cfg = PeriodicTaskConfig.create(
        name=fields["name"],
        spec=fields["spec"],
        task_type=fields["task_type"],
        payload=fields.get("payload"),
        options=fields.get("options"),
        timezone=fields["timezone"],
        anchor=fields.get("anchor"),
        allowed_targets=targets,
        max_payload_bytes=(
            DEFAULT_MAX_PAYLOAD_BYTES if max_payload_bytes is None else max_payload_bytes
        ),
    )
    calendar_rules.resolve(cfg, calendars)
    # The spec itself must fire; a schedule whose options.end_at has passed is valid (ended).
    if slots.Rule(cfg.schedule).next_slot(now) is None:
        raise ConfigError("spec", "has no fire time after now")
    return cfg


async def validate_write(
    request: Request, conn: Connection, fields: dict[str, Any], now: datetime
) -> PeriodicTaskConfig:
    """:func:`validate_row` with this deployment's settings; a payload or options over the size
    limit is a 413 problem, any other invalid field a 422."""
    settings = state_of(request.app).settings
    try:
        return validate_row(
            fields,
            now,
            targets=settings.configured_targets(),
            max_payload_bytes=settings.max_payload_bytes,
            calendars=await dbcalendars.specs(conn),
        )
    except ConfigError as exc:
        if exc.code != TOO_LARGE:
            raise
        raise ApiProblem(
            413, "payload-too-large", f"{exc.field}: {exc.reason}", errors=[config_error_item(exc)]
        ) from None


def merge_base(v: dbview.RowView) -> dict[str, Any]:
    """The stored row as the starting point of a PATCH: unreadable columns the manager judges as
    :class:`~periodic_manager.db.view.Unreadable` (options that are no JSON object too, although they are shown as {}).
    An unreadable ``description`` is left as it is (None here): only people read it."""
    return {
        name: v.values[name] if name == "description" else dbview.stored_value(v, name)
        for name in COLUMNS
    }


# -- slots and bodies ------------------------------------------------------------------------------


def next_runs(
    config: PeriodicTaskConfig, now: datetime, n: int = NEXT_RUNS, left: int | None = None
) -> list[datetime]:
    """The next ``n`` slots after ``now`` in UTC within the schedule's bounds (options.start_at,
    options.end_at) that are sent (none on a date of a calendar options.exclude names) and its
    ``left`` runs (options.max_runs), fewer when it ends, ``[]`` if they cannot be computed. The
    engine's slots: :mod:`periodic_manager.schedules.slots`, shared with every preview."""
    try:
        return [slot.at for slot in slots.Rule.of(config).upcoming(now, n, left=left)]
    except SLOT_ERRORS:
        return []


def runs_left(v: dbview.RowView, counted: int) -> int | None:
    """Runs left of a schedule with options.max_runs (``counted``: the runs the managers
    recorded), None without it (or an unusable row)."""
    limit = slot_runs.max_runs_of(v.config.options) if v.config is not None else None
    return None if limit is None else slot_runs.runs_left(limit, counted)


def status_of(v: dbview.RowView, now: datetime, left: int | None = None) -> Status:
    """The schedule's state as its row says: ``paused`` (enabled false), ``error`` (unusable
    row), ``ended`` (options.end_at not after now, or no run ``left`` of options.max_runs: no
    slot is left) or ``active``."""
    if v.enabled is False:
        return "paused"
    if v.config is None or v.enabled is not True:
        return "error"
    if left is not None and left <= 0:
        return "ended"  # as the engine: every run of options.max_runs was sent
    try:
        rule = slots.Rule.of(v.config)
    except ValueError:
        return "error"
    if rule.bounds.end_at is not None and rule.has_ended(now):
        return "ended"  # as the engine: the entry has no next slot
    return "active"


def api_errors(v: dbview.RowView) -> list[ScheduleError]:
    return [
        ScheduleError(
            source="api",
            field=f,
            reason=r,
            message=f"{f}: {r}",
            manager_id=None,
            stored=stored_text(v, f),
        )
        for f, r in v.errors
    ]


STORED_MAX_BYTES = DEFAULT_MAX_PAYLOAD_BYTES  # what an error shows of a column as stored


def stored_text(v: dbview.RowView, field: str) -> str | None:
    """The stored text of ``payload`` or ``options`` when the body cannot show it (null, or {}
    for options) although it is text: what is there is what needs repairing. None for any other
    field, and for text that is not UTF-8 or longer than :data:`STORED_MAX_BYTES`."""
    if field not in ("payload", "options") or field not in v.unreadable:
        return None
    index = dbrows.FIELDS.index(field)
    raw = v.raw[index] if index < len(v.raw) else None
    if isinstance(raw, bytes):  # SQLite: the stored bytes
        if len(raw) > STORED_MAX_BYTES:
            return None
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not isinstance(raw, str) or len(raw.encode()) > STORED_MAX_BYTES:
        return None
    return raw


PAUSED = {"paused_note": "note", "paused_at": "at", "paused_by": "by"}


def schedule_body(v: dbview.RowView) -> dict[str, Any]:
    body = {
        "id": v.id,
        **{k: v.values[k] for k in dbrows.FIELDS[1:] if k != "effective_at" and k not in PAUSED},
    }
    # Who paused it, when and why: shown while it is paused (a value that cannot be read is null,
    # and ``errors`` names its column).
    body["paused"] = (
        {shown: v.values[k] for k, shown in PAUSED.items()} if v.enabled is False else None
    )
    body["errors"] = api_errors(v)
    return body


def to_schedule(v: dbview.RowView) -> Schedule:
    return Schedule(**schedule_body(v))


def to_schedule_with_runs(v: dbview.RowView, now: datetime, counted: int) -> ScheduleWithRuns:
    """The schedule with its next runs; ``counted``: its runs the managers recorded (read with
    :func:`api.runtime.runs_counted`), for options.max_runs."""
    left = runs_left(v, counted)
    runs = next_runs(v.config, now, left=left) if v.enabled is True and v.config is not None else []
    return ScheduleWithRuns(
        **schedule_body(v), next_runs=runs, status=status_of(v, now, left), runs_left=left
    )
