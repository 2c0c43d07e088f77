"""Response bodies of ``/views``: what the dashboard needs that the public API does not offer in
one request (times are UTC ISO-8601; local times carry their offset and zone abbreviation)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class WhoAmI(BaseModel):
    auth: bool = Field(description="whether the API asks for a bearer token")
    can_write: bool = Field(description="whether the caller's scope allows editing schedules")
    scope: str = Field(description="the caller's scope: read, trigger, write or admin")
    key: str | None = Field(None, description="the name of the caller's API key, if it used one")


class LastRun(BaseModel):
    status: str = Field(examples=["enqueued", "skipped", "failed", "triggered"])
    slot_at: datetime | None  # null: the stored value cannot be read
    at: datetime | None
    lateness_ms: int | None


class LocalTime(BaseModel):
    at: datetime = Field(description="UTC")
    local: str = Field(description="the same instant in the schedule's zone, with its offset")
    abbreviation: str | None = Field(description="the zone's abbreviation then, e.g. CEST")


class ScheduleRowView(BaseModel):
    id: int
    name: str
    spec: str
    description: str | None = Field(description="the spec in English (null when not faithful)")
    timezone: str
    task_type: str
    queue: str | None = Field(description="`options.queue` (null when the options are unusable)")
    enabled: bool | None = Field(
        description="null when the stored value is neither true nor false (a row error)"
    )
    next: LocalTime | None = Field(
        description="the next slot (within options.start_at and options.end_at); null when "
        "paused, ended or unusable"
    )
    status: str = Field(
        "active",
        description="`active`, `paused`, `error` (unusable row) or `ended` (no slot left before "
        "options.end_at)",
        examples=["active", "ended"],
    )
    last_run: LastRun | None
    error: str | None = Field(
        description="why a live manager rejected the row, or why its slots cannot be computed"
    )


class ScheduleRowPage(BaseModel):
    items: list[ScheduleRowView]
    total: int
    limit: int
    offset: int
    sort: str
    now: datetime


class SlotView(BaseModel):
    at: datetime = Field(description="UTC")
    local: str = Field(description="local time with its offset")
    abbreviation: str | None
    marks: list[str] = Field(
        description="`offset-change`, `shifted` (spring-forward gap), `repeated-hour` (fold)"
    )
    notes: list[str] = Field(description="each mark in words")


class SlotList(BaseModel):
    schedule_id: int
    spec: str
    timezone: str
    description: str | None
    enabled: bool
    start_at: datetime | None = Field(None, description="options.start_at: no slot before it")
    end_at: datetime | None = Field(None, description="options.end_at: no slot at or after it")
    slots: list[SlotView]
    error: str | None = Field(description="why no slots can be computed (unusable stored row)")


class Counts(BaseModel):
    schedules: int
    enabled: int = Field(description="schedules whose `enabled` is true (the `enabled=true` list)")
    paused: int = Field(description="schedules whose `enabled` is false (the `enabled=false` list)")
    in_error: int = Field(
        description="schedules a live manager rejected (the `in_error=true` list)"
    )


class SeriesPoint(BaseModel):
    start_at: datetime = Field(description="start of the one-minute bucket")
    enqueued: int
    skipped: int
    held: int = Field(
        description="slots held while the previous task still ran (options.overlap hold)"
    )
    failed: int
    duplicate: int
    resent: int = Field(
        description="published again with the same task id: the broker never confirmed the first publish"
    )
    triggered: int
    backfilled: int = Field(description="missed slots sent by a backfill")


class Lateness(BaseModel):
    count: int = Field(description="enqueued slots measured: the window's newest, at most 10,000")
    p50_ms: int | None
    p90_ms: int | None
    p99_ms: int | None
    max_ms: int | None


class ManagerSummary(BaseModel):
    live: int
    leader: str | None = Field(description="manager_id of the leader, if one leads")


class Overview(BaseModel):
    now: datetime
    counts: Counts
    window_start_at: datetime
    series: list[SeriesPoint] = Field(description="60 one-minute buckets, oldest first")
    lateness: Lateness = Field(
        description="nearest-rank percentiles of the last hour's newest 10,000 enqueued slots"
    )
    managers: ManagerSummary


class ManagerView(BaseModel):
    manager_id: str
    hostname: str
    pid: int | None  # null: the stored value cannot be read
    version: str
    started_at: datetime | None
    heartbeat_at: datetime
    heartbeat_age_s: float
    is_leader: bool
    last_sync_at: datetime | None
    last_sync_error: str | None
    entry_count: int | None = Field(description="as the manager reported it with its heartbeat")
    target_down: str | None = Field(
        None,
        description="why this manager holds no work: its targets fail their pings (null: it may)",
    )
    clock_offset_s: float | None = Field(
        None, description="seconds its wall clock is ahead of the database's (null: not measured)"
    )
    partitions: list[int] = Field(description="the partitions whose lease names this manager")
    partition_ranges: str = Field(
        description="the same as compact ranges, e.g. '0-21, 40' (empty: none)"
    )
    entries_active: int
    entries_error: int


class ManagerViewList(BaseModel):
    now: datetime
    items: list[ManagerView]


class EntryView(BaseModel):
    manager_id: str
    manager_is_leader: bool
    schedule_id: int | None
    schedule_key: str
    name: str | None
    status: str
    hash: str
    spec: str | None
    timezone: str | None
    queue: str | None
    registered_at: datetime | None  # null: the stored value cannot be read
    last_error: str | None
    last_good_since: datetime | None = None  # the row's last good version runs, kept since


class EntryViewPage(BaseModel):
    items: list[EntryView]
    total: int
    limit: int
    offset: int
