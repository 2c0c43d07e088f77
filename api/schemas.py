"""Request and response bodies, as the OpenAPI document describes them. A schedule's fields are
decided by the judge (``periodic_manager.schedules.judge``), whose limits mirror the
``periodic_jobs`` columns, so an input the database would refuse is a 422, never a driver
error; the bodies here only document them."""

from __future__ import annotations

import unicodedata
from datetime import date, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from periodic_manager.schedules import judge


def _no_nul(value: Any) -> Any:
    # PostgreSQL text cannot hold NUL; a query with one would fail in the driver.
    if isinstance(value, str) and "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


NoNul = AfterValidator(_no_nul)

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
        description="as the manager last saw it: queued, running, unfinished (queued or "
        "running: the target cannot tell which) or finished",
        examples=["running"],
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
        None,
        description="options.overlap skip or hold: the held slot and the previous task, as a "
        "live manager reports them (null: no manager reports any)",
    )


class SchedulePage(BaseModel):
    items: list[Schedule]
    total: int
    limit: int
    offset: int


class EntryOut(BaseModel):
    entry_id: str
    schedule_id: int | None = Field(description="the row id when the schedule key is one")
    schedule_key: str
    name: str | None
    hash: str = Field(description="content hash of the schedule the entry was built from")
    status: str = Field(
        description="`active`, `error` (row rejected) or `ended` (active, no slot left before "
        "options.end_at, or every run of options.max_runs sent)",
        examples=["active", "error", "ended"],
    )
    spec: str | None
    timezone: str | None
    task_type: str | None
    queue: str | None
    next_slot: datetime | None
    previous_slot: datetime | None
    last_error: str | None
    manager_id: str
    manager_is_leader: bool
    manager_heartbeat_at: datetime
    registered_at: datetime | None = Field(description="null when the stored value is unreadable")
    held_slot: datetime | None = Field(
        None, description="options.overlap hold: the slot held while the previous task runs"
    )
    previous_task: PreviousTask | None = Field(
        None, description="options.overlap skip or hold: the schedule's last task, as last seen"
    )
    last_good_since: datetime | None = Field(
        None,
        description="status `error`: the manager keeps running the row's last good version, "
        "kept since this instant (null: no version of the row runs there)",
    )


class EntryList(BaseModel):
    items: list[EntryOut]


class Health(BaseModel):
    status: str = "ok"


class ProblemError(BaseModel):
    location: str = Field(description="body, query, path or header", examples=["body"])
    field: str | None = Field(
        description="dotted path inside the location; null when all of it is at fault",
        examples=["options.queue"],
    )
    reason: str = Field(examples=["unknown option (known: extra, max_retry, queue, ...)"])
    code: str = Field(description="machine-readable kind", examples=["value_error", "never-fires"])


class Problem(BaseModel):
    """RFC 9457 problem details; every 4xx/5xx body has this shape."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(examples=["urn:periodic-manager:problem:validation-error", "about:blank"])
    title: str = Field(examples=["Unprocessable Content"])
    status: int = Field(examples=[422])
    detail: str | None = Field(None, examples=["1 invalid field"])
    errors: list[ProblemError] | None = Field(
        None, description="each invalid field (validation errors and name conflicts)"
    )
    checks: dict[str, str] | None = Field(None, description="readiness checks (GET /readyz)")


class RunOut(BaseModel):
    """A row of the history; a value the table holds but that cannot be read (written there
    with SQL) is null."""

    id: int
    slot_at: datetime | None = Field(
        description="the slot (for a manual trigger: when it was asked)"
    )
    status: str = Field(
        examples=[
            "enqueued",
            "duplicate",
            "resent",
            "skipped",
            "failed",
            "held",
            "triggered",
            "backfilled",
        ]
    )
    at: datetime | None = Field(description="when the manager (or the API) handled it")
    lateness_ms: int | None = Field(description="at - slot_at, in milliseconds")
    message_id: str | None
    error: str | None


class RunPage(BaseModel):
    items: list[RunOut]
    total: int
    limit: int
    offset: int


class FieldChangeOut(BaseModel):
    """One column's change. Values as stored (text cut to 2000 characters, `truncated` then),
    shown as a person reads them: `enabled` a boolean, `payload` and `options` their JSON value,
    `anchor` an ISO-8601 UTC instant, where the stored text is one; null: NULL or unreadable."""

    before: Any = Field(examples=["*/5 * * * *"])
    after: Any = Field(examples=["*/10 * * * *"])
    truncated: bool = Field(description="a value was longer than 2000 characters and was cut")


class ChangeOut(BaseModel):
    """An entry of a schedule's change history; a value the table holds but that cannot be
    read (written there with SQL) is null."""

    id: int
    at: datetime | None = Field(description="when the change was made")
    action: str = Field(examples=["created", "updated", "paused", "resumed", "deleted"])
    source: str = Field(
        description="who wrote it: `api`, `import`, `manager`, or `sql` (any other writer)",
        examples=["api", "sql", "import", "manager"],
    )
    actor: str | None = Field(
        description="who, where known: the database role for `sql` on PostgreSQL, the manager "
        "id for `manager`; null for `api` (tokens have no names) and `import`"
    )
    name: str | None = Field(description="the schedule's name after the change (before, deleted)")
    changes: dict[str, FieldChangeOut] | None = Field(
        description="each tracked column that changed; null when the stored entry is unreadable"
    )


class ChangePage(BaseModel):
    items: list[ChangeOut]
    total: int
    limit: int
    offset: int


class TriggerResult(BaseModel):
    task_id: str
    idempotency_key: str = Field(
        examples=["reports.daily:trigger:2026-03-01T12:00:30Z:4f1c2a9be0d1"]
    )
    message_id: str | None
    status: str = Field(examples=["enqueued"])
    queue: str
    enqueued_at: datetime


class BackfillIn(BaseModel):
    """A range of slots to send: ``[from, to)``, ISO 8601 instants with a UTC offset."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    from_: Any = Field(
        alias="from",
        description="the first instant of the range (included)",
        examples=["2026-03-01T00:00:00Z"],
    )
    to: Any = Field(
        description="the end of the range (excluded), not after now",
        examples=["2026-03-01T01:00:00Z"],
    )
    dry_run: bool = Field(False, description="count only: send nothing, record nothing")
    force: bool = Field(
        False,
        description="also send the slots older than what is remembered (`unchecked`: before "
        "PM_RUNS_RETENTION, or before the oldest slot of a history at its cap), which may have "
        "been sent already",
    )


class BackfillResult(BaseModel):
    slots: int = Field(description="slots of the schedule in the range (excluded ones too)")
    excluded: int = Field(description="slots on a date `options.exclude` holds: never sent")
    already_sent: int = Field(
        description="slots known sent: in the run history or the backfill records, the latest "
        "recorded slot, claimed by another backfill, or still claimed by the target (a dry run "
        "does not ask the target)"
    )
    unchecked: int = Field(
        description="slots older than what is remembered, so not known sent or not: sent only "
        "with `force`"
    )
    to_send: int = Field(
        description="slots not known sent before this run, `unchecked` ones with `force` (a dry "
        "run: would send)"
    )
    sent: int = Field(description="slots sent now, recorded `backfilled` (0 in a dry run)")
    over_limit: int = Field(
        description="slots not sent: `options.max_runs` has no run left for them (a dry run: "
        "would not be sent)"
    )
    skipped: int = Field(description="slots options.overlap refused (the previous task unfinished)")
    failed: int = Field(description="slots the target did not take")
    dry_run: bool
    forced: bool = Field(description="`force` was given")


class ManagerOut(BaseModel):
    """A live manager; a value its row holds but that cannot be read is null."""

    manager_id: str
    hostname: str
    pid: int | None
    version: str
    started_at: datetime | None
    heartbeat_at: datetime
    heartbeat_age_s: float = Field(description="seconds since the last heartbeat")
    is_leader: bool
    last_sync_at: datetime | None
    last_sync_error: str | None
    entry_count: int | None
    clock_offset_s: float | None = Field(
        None,
        description="seconds its wall clock is ahead of the database's, as it last measured "
        "(negative: behind; null: not measured)",
    )
    partitions: list[int] = Field(
        description="the partitions whose lease names this manager (PM_COORDINATION=partitions; "
        "empty with one leader)"
    )
    target_down: str | None = Field(
        None,
        description="why this manager holds no work: every target failed its pings "
        "(PM_TARGET_PING_FAILURES in a row); null while it may hold work",
    )


class ManagerList(BaseModel):
    items: list[ManagerOut]


class Slot(BaseModel):
    at: datetime = Field(description="UTC")
    local: str = Field(description="the same instant in the zone, ISO 8601 with its offset")


class CronPreview(BaseModel):
    spec: str
    timezone: str
    description: str | None = Field(
        description="in English; null where the describing library would misstate our dialect"
    )
    next: list[Slot]


class Readiness(BaseModel):
    status: str = Field(examples=["ready"])
    checks: dict[str, str] = Field(examples=[{"database": "ok", "manager": "leader"}])


# -- calendars -------------------------------------------------------------------------------------


class HolidaysSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    country: str = Field(max_length=3, examples=["DE"], description="ISO 3166 country code")
    subdiv: str | None = Field(None, max_length=10, examples=["BY"], description="subdivision")


class CalendarBody(BaseModel):
    """The body of ``PUT /calendars/{name}``: exactly one of ``dates`` and ``holidays``."""

    model_config = ConfigDict(extra="forbid")

    dates: list[str] | None = Field(
        None,
        max_length=10_000,
        examples=[["2026-12-24", "2026-12-31"]],
        description="dates as YYYY-MM-DD (at most 10,000)",
    )
    holidays: HolidaysSpec | None = Field(
        None, description="the public holidays of a country (the holidays package), every year"
    )


class CalendarView(BaseModel):
    name: str
    kind: Literal["dates", "holidays"] | None = Field(
        description="null when the stored calendar cannot be read (see error)"
    )
    dates: list[date] = Field(
        default_factory=list,
        description="its dates (holidays: those of this year and the next)",
    )
    holidays: dict[str, str | None] | None = None
    updated_at: datetime | None = None
    error: str | None = Field(None, description="why a stored calendar cannot be used")
    used_by: list[str] | None = Field(
        None, description="names of the schedules whose options.exclude names it (one calendar)"
    )


class CalendarList(BaseModel):
    items: list[CalendarView]
