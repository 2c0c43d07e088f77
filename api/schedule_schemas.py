"""The bodies of ``/schedules``, as the OpenAPI document describes them: what a client sends
(create, update, pause) and what it gets back (a stored row, with its runs and state).

A schedule's fields are decided by the judge (``periodic_manager.schedules.judge``), whose limits
mirror the ``periodic_jobs`` columns, so an input the database would refuse is a 422, never a
driver error; the request bodies here only document them."""

from __future__ import annotations

import unicodedata
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from periodic_manager.schedules import judge

# The fields of a schedule body are judged by the one judge (periodic_manager/schedules/judge.py),
# whatever JSON value they hold, as a stored row's and a file's are: here they are typed Any and
# only documented (what the judge accepts), never decided.


def _documented(schema: dict[str, Any], nullable: bool = False) -> Any:
    return WithJsonSchema({"anyOf": [schema, {"type": "null"}]} if nullable else schema)


def _text(limit: int) -> dict[str, Any]:
    return {"type": "string", "maxLength": limit}


Name = Annotated[Any, _documented(_text(judge.NAME_MAX)), Field(examples=["reports.daily"])]
Spec = Annotated[
    Any,
    _documented(_text(judge.SPEC_MAX)),
    Field(description="cron expression, macro or `@every`", examples=["*/5 * * * *"]),
]
Zone = Annotated[
    Any, _documented(_text(judge.ZONE_MAX)), Field(description="IANA zone name", examples=["UTC"])
]
TaskType = Annotated[
    Any, _documented(_text(judge.TASK_TYPE_MAX)), Field(examples=["reports.build"])
]
Description = Annotated[Any, _documented(_text(judge.DESCRIPTION_MAX), nullable=True)]
Anchor = Annotated[
    Any,
    WithJsonSchema(
        {
            "anyOf": [
                {
                    "description": "instant that phases an `@every` interval (needs a UTC offset)",
                    "format": "date-time",
                    "type": "string",
                },
                {"type": "null"},
            ]
        }
    ),
]
Options = Annotated[Any, _documented({"type": "object", "additionalProperties": True})]
Enabled = Annotated[Any, _documented({"type": "boolean"})]
PAYLOAD_DOC = "any JSON value handed to the task"
OPTIONS_DOC = (
    "queue, max_retry, timeout, unique_ttl, target, misfire, catchup_window, overlap "
    "(allow, skip, hold), overlap_timeout, extra, start_at, end_at (ISO 8601 instants with "
    "offset: no slot before start_at nor at or after end_at), jitter (seconds under the "
    "shortest gap: each slot sent at slot + [0, jitter), scheduled_at unchanged), max_runs "
    "(1 to 10^9: the schedule ends after that many scheduled slots were sent), exclude "
    "(names of calendars, PUT /calendars/{name}: no slot on their dates in the schedule's zone)"
)


def _body_schema(required: tuple[str, ...]) -> Any:
    def extra(schema: dict[str, Any]) -> None:
        # What the judge requires of a body: no other field, these ones given.
        schema["additionalProperties"] = False
        if required:
            schema["required"] = list(required)

    return extra


class ScheduleCreate(BaseModel):
    """A new schedule; a field left out takes its default (the judge's)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_body_schema(judge.REQUIRED))

    name: Name = None
    spec: Spec = None
    timezone: Zone = "UTC"
    task_type: TaskType = None
    payload: Any = Field(None, description=PAYLOAD_DOC)
    options: Options = Field(default_factory=dict, description=OPTIONS_DOC)
    enabled: Enabled = True
    description: Description = None
    anchor: Anchor = None

    def fields(self) -> dict[str, Any]:
        """The body as given, unknown fields too: what the judge judges."""
        return self.model_dump(exclude_unset=True)


def _absent_means_unchanged(schema: dict[str, Any]) -> None:
    # A field left out of a PATCH keeps its value; its default is no value a client may send.
    schema.pop("default", None)


def _unchanged(**kwargs: Any) -> Any:
    return Field(None, json_schema_extra=_absent_means_unchanged, **kwargs)


class ScheduleUpdate(BaseModel):
    """Any subset of the create fields; the merged row is validated like a new one. Only
    ``payload``, ``description`` and ``anchor`` may be null (JSON null, no text, no anchor);
    the others may be left out but not cleared."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_body_schema(()))

    name: Name = _unchanged()
    spec: Spec = _unchanged()
    timezone: Zone = _unchanged()
    task_type: TaskType = _unchanged()
    payload: Any = _unchanged(description=PAYLOAD_DOC)
    options: Options = _unchanged(description=OPTIONS_DOC)
    enabled: Enabled = _unchanged()
    description: Description = _unchanged()
    anchor: Anchor = _unchanged()

    def fields(self) -> dict[str, Any]:
        """The fields the PATCH gives, unknown ones too."""
        return self.model_dump(exclude_unset=True)


NOTE_MAX = 500


def _no_controls(value: Any) -> Any:
    # A note is one line of text people read on the dashboard: no control characters (NUL,
    # newlines, escapes, C1), which would also let a note pass itself off as other output.
    if isinstance(value, str) and any(unicodedata.category(c) == "Cc" for c in value):
        raise ValueError("must not contain control characters (one line of text)")
    return value


class PauseRequest(BaseModel):
    """The optional body of ``POST /schedules/{id}/pause``."""

    model_config = ConfigDict(extra="forbid")

    note: (
        Annotated[
            str,
            Field(max_length=NOTE_MAX, examples=["database maintenance until 14:00"]),
            AfterValidator(_no_controls),
        ]
        | None
    ) = Field(
        None,
        description=f"why the schedule is paused (up to {NOTE_MAX} characters, one line), "
        "shown with the schedule until it resumes",
    )


class PausedInfo(BaseModel):
    """Who paused a schedule, when and why. Each is null when unknown: paused before these were
    kept, no note given, or a stored value that cannot be read (``errors`` names it)."""

    note: str | None = Field(description="the note given with the pause")
    at: datetime | None = Field(description="when it was paused")
    by: str | None = Field(
        description="`api` (the API: its tokens have no names), `import`, `sql` (a plain SQL "
        "UPDATE of `enabled`), or whatever a SQL statement wrote",
        examples=["api"],
    )


class ScheduleError(BaseModel):
    """Why a schedule cannot be used (or a column cannot be read)."""

    source: Literal["api", "manager"] = Field(
        description="`api`: the API's own reading of the stored row (the same judgement a "
        "manager makes); `manager`: reported by the live manager `manager_id`"
    )
    field: str | None = Field(examples=["spec", "options.queue"])
    reason: str
    message: str = Field(description="`<field>: <reason>`", examples=["spec: minute: ..."])
    manager_id: str | None = Field(description="the reporting manager (source `manager`)")
    last_good_since: datetime | None = Field(
        default=None,
        description="source `manager`: that manager keeps running the row's last good version "
        "(until the row is fixed, paused or deleted; across restarts), kept since this instant; "
        "null: no version of the row runs there",
    )
    stored: str | None = Field(
        default=None,
        description="`payload` or `options` shown as null or {} although the column holds text "
        "(not JSON, not an object, ...): that text as stored, to see what to repair (null when "
        "it is not UTF-8 or longer than 65,536 bytes)",
        examples=["[1, 2]"],
    )


ERRORS_DOC = (
    "why the stored row cannot be used, as a manager judges it (first item: what a manager "
    "reports for it when enabled; further items: other columns that cannot be read, shown as "
    "null); empty when the row is fine"
)


class Schedule(BaseModel):
    """A stored row. A column that cannot be read (written with SQL: not UTF-8, not JSON, an
    instant out of range, ...) is null (``options``: {}), and ``errors`` says why."""

    id: int
    name: str | None
    spec: str | None
    timezone: str | None
    anchor: datetime | None
    task_type: str | None
    payload: Any = Field(description=PAYLOAD_DOC)
    options: dict[str, Any] = Field(description="JSON object (" + OPTIONS_DOC + ")")
    enabled: bool | None = Field(description="null when the stored value is neither true nor false")
    description: str | None
    created_at: datetime | None
    updated_at: datetime | None
    paused: PausedInfo | None = Field(
        None, description="when `enabled` is false: who paused it, when and why; else null"
    )
    errors: list[ScheduleError] = Field(description=ERRORS_DOC)


class SchedulePage(BaseModel):
    items: list[Schedule]
    total: int
    limit: int
    offset: int


class ScheduleWithRuns(Schedule):
    next_runs: list[datetime] = Field(
        description="the next 3 slots (UTC) within options.start_at and options.end_at and the "
        "runs left of options.max_runs; empty when disabled, ended or when the row is unusable"
    )
    status: Literal["active", "paused", "error", "ended"] = Field(
        "active",
        description="`paused`: enabled is false; `error`: the row is unusable; `ended`: "
        "no slot is left before options.end_at, or every run of options.max_runs was sent; "
        "else `active`",
    )
    runs_left: int | None = Field(
        None,
        description="options.max_runs: scheduled slots still to send, as the managers recorded "
        "(manual triggers do not count); null without options.max_runs",
        examples=[3],
    )


class ScheduleState(BaseModel):
    last_slot_at: datetime | None
    last_enqueued_at: datetime | None
    last_message_id: str | None
    last_status: str | None
    last_error: str | None
    counts: dict[str, int] = Field(
        examples=[
            {"enqueued": 3, "duplicate": 0, "skipped": 0, "failed": 0, "held": 0, "resent": 0}
        ]
    )


class ScheduleRowError(BaseModel):
    manager_id: str
    message: str
    last_good_since: datetime | None = None


class PreviousTask(BaseModel):
    task_id: str | None = Field(description="the task id (null: none known yet)")
    state: str | None = Field(
        examples=["running"],
        description="as the manager last saw it: queued, running, unfinished (queued or "
        "running: the target cannot tell which) or finished",
    )


class OverlapState(BaseModel):
    manager_id: str = Field(description="the live manager that reports it (the leader first)")
    held_slot: datetime | None = Field(
        description="options.overlap hold: the slot held while the previous task runs"
    )
    previous_task: PreviousTask


class ScheduleDetail(ScheduleWithRuns):
    state: ScheduleState | None = Field(description="runtime state written by the managers")
    errors: list[ScheduleError] = Field(
        description="the API's judgement of the stored row (`source: api`, as in the list), then "
        "what live managers report about it (`source: manager`, e.g. a rejection they logged)"
    )
    overlap: OverlapState | None = Field(
        default=None,
        description="options.overlap skip or hold: the held slot and the previous task, as a "
        "live manager reports them (null: no manager reports any)",
    )
