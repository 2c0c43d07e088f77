"""Schedule rows <-> API bodies: judging rows with the one judge, the row a write stores, and
its upcoming slots.

Every route that reads a row reads it raw (``periodic_manager.db.schedule_reader``) and judges it
as the manager does (``periodic_manager.db.judge``), so no stored value can fail a request, and
``errors`` of a schedule is the manager's own verdict on it. Every write is judged by the same
judge (``periodic_manager.schedules.judge``) before it is stored: its 422s are the judge's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from fastapi import Request

from periodic_manager.db import calendars as dbcalendars
from periodic_manager.db import judge as dbjudge
from periodic_manager.db import rows as dbrows
from periodic_manager.db import view as dbview
from periodic_manager.db.engine import Connection, reads_bytes
from periodic_manager.errors import ConfigError
from periodic_manager.schedules import runs as slot_runs
from periodic_manager.schedules import slots
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.judge import DEFAULTS, FIELDS, MAX_EVERY_DAYS, Deployment, judge
from periodic_manager.schedules.rules import DEFAULT_MAX_PAYLOAD_BYTES

from .errors import judged_problem
from .schedule_schemas import Schedule, ScheduleError, ScheduleWithRuns
from .state import state_of

NEXT_RUNS = 3
Status = Literal["active", "paused", "error", "ended"]
# Errors a stored row (possibly written with SQL) can raise while its slots are computed.
SLOT_ERRORS = (ValueError, TypeError, ArithmeticError, LookupError, StopIteration)


# -- reading -------------------------------------------------------------------------------------


async def rules(request: Request, conn: Connection) -> dbjudge.Rules:
    """How this deployment judges rows: backend, size limit, configured targets, and the
    calendars options.exclude may name (read now, as the manager reads them at a sync)."""
    settings = state_of(request.app).settings
    return dbjudge.rules_for(
        reads_bytes(conn), settings.max_payload_bytes, settings.configured_targets()
    ).with_calendars(await dbcalendars.specs(conn))


# -- judging a write -------------------------------------------------------------------------


async def validate_write(
    request: Request, conn: Connection, fields: dict[str, Any], now: datetime
) -> dict[str, Any]:
    """The row to write for ``fields`` (a new one, or the merge of a PATCH), as the judge
    (:mod:`periodic_manager.schedules.judge`) judges it with this deployment's settings and
    calendars, firing after ``now``: every field, its default where left out, the anchor an
    instant. Refused: a stored value that cannot be read and is not replaced (a 422 naming it),
    or whatever the judge finds (:func:`~api.errors.judged_problem`: a 422 naming each field, a
    413 for a payload or options over the size limit)."""
    for name, value in fields.items():
        if isinstance(value, dbview.Unreadable):
            raise ConfigError(name, f"the stored value cannot be used ({value.reason}); send one")
    settings = state_of(request.app).settings
    deployment = Deployment(
        settings.max_payload_bytes,
        settings.configured_targets(),
        await dbcalendars.specs(conn),
        now,
    )
    verdict = judge(fields, deployment)
    if isinstance(verdict, list):
        raise judged_problem(verdict)
    return {**DEFAULTS, **fields, "anchor": verdict.anchor}


# A row no rule refuses whatever fields are merged onto it: no jitter reaches its gap, no target
# or calendar is asked.
NEUTRAL = {"name": "x", "spec": f"@every {MAX_EVERY_DAYS}d", "task_type": "t"}


def refuse_alone(request: Request, fields: dict[str, Any]) -> None:
    """Refuse the fields of a PATCH that the judge refuses whatever the stored row holds (an
    unknown field, a value its own rule refuses), before the row is looked for."""
    settings = state_of(request.app).settings
    verdict = judge({**NEUTRAL, **fields}, Deployment(settings.max_payload_bytes))
    if isinstance(verdict, list):
        raise judged_problem(verdict)


def merge_base(v: dbview.RowView) -> dict[str, Any]:
    """The stored row as the starting point of a PATCH: unreadable columns the manager judges as
    :class:`~periodic_manager.db.view.Unreadable` (options that are no JSON object too, although they are shown as {}).
    An unreadable ``description`` is left as it is (None here): only people read it."""
    return {
        name: v.values[name] if name == "description" else dbview.stored_value(v, name)
        for name in FIELDS
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
