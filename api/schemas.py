"""Request and response bodies. Field limits mirror the ``periodic_jobs`` columns so an input the
database would refuse is a 422 here, never a driver error."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    field_validator,
)


def _iso_text(value: Any) -> Any:
    # Lax datetime parsing would also take numbers as Unix timestamps; an anchor is ISO text.
    if value is not None and not isinstance(value, str | datetime):
        raise ValueError("must be an ISO 8601 date-time string with a UTC offset")
    return value


Name = Annotated[str, Field(max_length=200, examples=["reports.daily"])]
Spec = Annotated[
    str,
    Field(
        max_length=200, description="cron expression, macro or `@every`", examples=["*/5 * * * *"]
    ),
]
Zone = Annotated[str, Field(max_length=64, description="IANA zone name", examples=["UTC"])]
TaskType = Annotated[str, Field(max_length=200, examples=["reports.build"])]
Description = Annotated[str, Field(max_length=10_000)]
Anchor = Annotated[
    AwareDatetime,
    BeforeValidator(_iso_text),
    Field(description="instant that phases an `@every` interval (needs a UTC offset)"),
]
PAYLOAD_DOC = "any JSON value handed to the task"
OPTIONS_DOC = "queue, max_retry, timeout, unique_ttl, extra"


class ScheduleCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name
    spec: Spec
    timezone: Zone = "UTC"
    task_type: TaskType
    payload: Any = Field(None, description=PAYLOAD_DOC)
    options: dict[str, Any] = Field(default_factory=dict, description=OPTIONS_DOC)
    enabled: StrictBool = True
    description: Description | None = None
    anchor: Anchor | None = None


class ScheduleUpdate(BaseModel):
    """Any subset of the create fields; the merged row is validated like a new one."""

    model_config = ConfigDict(extra="forbid")

    name: Name | None = None
    spec: Spec | None = None
    timezone: Zone | None = None
    task_type: TaskType | None = None
    payload: Any = Field(None, description=PAYLOAD_DOC)
    options: dict[str, Any] | None = Field(None, description=OPTIONS_DOC)
    enabled: StrictBool | None = None
    description: Description | None = None
    anchor: Anchor | None = None

    @field_validator("name", "spec", "timezone", "task_type", "options", "enabled", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        # Runs only for fields present in the body: an explicit null cannot clear these columns.
        if value is None:
            raise ValueError("may not be null")
        return value


class Schedule(BaseModel):
    id: int
    name: str
    spec: str
    timezone: str
    anchor: datetime | None
    task_type: str
    payload: Any = Field(description=PAYLOAD_DOC)
    options: Any = Field(description="JSON object (" + OPTIONS_DOC + ")")
    enabled: bool
    description: str | None
    created_at: datetime
    updated_at: datetime


class ScheduleWithRuns(Schedule):
    next_runs: list[datetime] = Field(
        description="the next 3 slots (UTC); empty when disabled or when the row is unusable"
    )


class ScheduleState(BaseModel):
    last_slot_at: datetime | None
    last_enqueued_at: datetime | None
    last_message_id: str | None
    last_status: str | None
    last_error: str | None
    counts: dict[str, int] = Field(
        examples=[{"enqueued": 3, "duplicate": 0, "skipped": 0, "failed": 0}]
    )


class ScheduleRowError(BaseModel):
    manager_id: str
    message: str


class ScheduleDetail(ScheduleWithRuns):
    state: ScheduleState | None = Field(description="runtime state written by the managers")
    errors: list[ScheduleRowError] = Field(
        description="why live managers rejected this row (e.g. after an edit made with SQL)"
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
    status: str = Field(examples=["active", "error"])
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
    registered_at: datetime


class EntryList(BaseModel):
    items: list[EntryOut]


class Health(BaseModel):
    status: str = "ok"


class NotFoundBody(BaseModel):
    detail: str = Field(examples=["schedule 12 not found"])


class ErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(BaseModel):
    detail: list[ErrorItem]
