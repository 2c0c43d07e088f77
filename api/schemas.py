"""Request and response bodies, as the OpenAPI document describes them (those of
``/schedules``: :mod:`api.schedule_schemas`)."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from periodic_manager.contracts import SLOT_REASONS

from .schedule_schemas import PreviousTask


def _no_nul(value: Any) -> Any:
    # PostgreSQL text cannot hold NUL; a query with one would fail in the driver.
    if isinstance(value, str) and "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


NoNul = AfterValidator(_no_nul)


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
    reason: str | None = Field(
        None,
        description="why it was skipped, held or failed, or sent the way it was (one of "
        f"{', '.join(SLOT_REASONS)}); null when it has none",
    )


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
