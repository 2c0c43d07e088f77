"""A schedule's history (``pm_runs``) and manual triggers.

A trigger enqueues one task now through the in-process manager's target (or one built from the
settings), with an idempotency key of its own, ``<name>:trigger:<now UTC>:<random>``, so it never
collides with a slot's key nor with another trigger in the same instant. It works on paused
schedules too (run it now, keep it paused) and is recorded in the history as ``triggered``
(``failed`` when the target refused it). A schedule with ``options.overlap`` skip or hold is no
exception: while its previous task is queued or running the trigger is refused with 409 (and
recorded ``skipped``), and a triggered task is the previous task of the next slot.

A schedule's stats count its history over the last hour and day, by the API's clock: percentiles
of the sent slots' lateness, runs by status and by reason, and the newest run late beyond grace.

A backfill (:mod:`periodic_manager.backfill`) sends every slot of a range that was never sent,
with the slot's own key, through the same target, paced at ``PM_CATCHUP_RATE``; its sent slots
are recorded ``backfilled``. A paused schedule is refused (409): resume it first.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, get_args

from fastapi import APIRouter, Query, Request, status

from periodic_manager import backfill as slot_backfill
from periodic_manager.contracts import SENT, SLOT_REASONS, EnqueueResult, Target
from periodic_manager.db import history, stats
from periodic_manager.db.engine import Connection
from periodic_manager.db.view import RowView
from periodic_manager.errors import ConfigError
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.instants import slot_text
from periodic_manager.settings import Settings
from periodic_manager.targets.base import task_for

from ..deps import AppSettings, Conn, Now, Page, get_clock, get_state, get_target
from ..errors import ApiProblem, config_error_item
from ..routes.schedules import NOT_FOUND, ScheduleId, load_row, row_exists
from ..schemas import (
    BackfillIn,
    BackfillResult,
    LateRunOut,
    RunOut,
    RunPage,
    ScheduleStats,
    TriggerResult,
    WindowStats,
)

log = logging.getLogger(__name__)
router = APIRouter(prefix="/schedules", tags=["history"])

RunStatus = Literal[
    "enqueued", "duplicate", "resent", "skipped", "failed", "held", "triggered", "backfilled"
]


@router.get(
    "/{schedule_id}/runs",
    response_model=RunPage,
    responses=NOT_FOUND,
    summary="Run history of a schedule, newest slot first",
)
async def list_runs(
    schedule_id: ScheduleId,
    conn: Conn,
    paging: Page,
    status: Annotated[RunStatus | None, Query(description="only runs with this outcome")] = None,
) -> RunPage:
    await row_exists(conn, schedule_id)
    total, rows = await history.page(conn, str(schedule_id), status, **paging._asdict())
    items = [RunOut.model_validate(r, from_attributes=True) for r in rows]
    return RunPage(items=items, total=total, **paging._asdict())


# Runs counted by the stats: the day's newest (a schedule's history is capped anyway, by
# PM_RUNS_MAX_PER_SCHEDULE, but that cap has no ceiling of its own).
STATS_SAMPLE = 10_000
# Reasons of a slot that was late beyond its grace: skipped late, or failed while the target
# was down until its grace ended.
LATE_REASONS = ("late", "target-down")


@router.get(
    "/{schedule_id}/stats",
    response_model=ScheduleStats,
    responses=NOT_FOUND,
    summary="Lateness and outcomes of a schedule over the last hour and day",
)
async def schedule_stats(schedule_id: ScheduleId, conn: Conn, now: Now) -> ScheduleStats:
    await row_exists(conn, schedule_id)
    key = str(schedule_id)
    hour, day = now - timedelta(hours=1), now - timedelta(days=1)
    tallies = await stats.schedule_tallies(conn, key, day, hour, STATS_SAMPLE)
    late = await stats.newest_with_reason(conn, key, LATE_REASONS)
    return ScheduleStats(
        schedule_id=schedule_id,
        now=now,
        last_hour=_window(hour, [t for t in tallies if t.recent]),
        last_day=_window(day, tallies),
        last_late=None
        if late is None
        else LateRunOut(
            slot_at=late.slot_at,
            at=late.at,
            status=late.status,
            reason=late.reason,
            lateness_s=_seconds(late.lateness_ms),
            error=late.error,
        ),
    )


def _window(since: datetime, tallies: list[stats.RunTally]) -> WindowStats:
    """The counts and lateness percentiles of a window's runs."""
    by_status: dict[str, int] = dict.fromkeys(get_args(RunStatus), 0)
    by_reason: dict[str, int] = dict.fromkeys(SLOT_REASONS, 0)
    lateness: dict[int, int] = {}
    for t in tallies:
        status_ = t.status if t.status in by_status else "other"
        by_status[status_] = by_status.get(status_, 0) + t.count
        if t.reason is not None:
            reason = t.reason if t.reason in by_reason else "other"
            by_reason[reason] = by_reason.get(reason, 0) + t.count
        if t.status in SENT and t.lateness_ms is not None:
            lateness[t.lateness_ms] = lateness.get(t.lateness_ms, 0) + t.count
    p50, p99 = stats.nearest_ranks(sorted(lateness.items()), (0.5, 0.99)) or (None, None)
    return WindowStats(
        since=since,
        runs=sum(t.count for t in tallies),
        sent=sum(lateness.values()),
        lateness_p50_s=_seconds(p50),
        lateness_p99_s=_seconds(p99),
        by_status=by_status,
        by_reason=by_reason,
    )


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


TRIGGER_RESPONSES: dict[int | str, dict[str, Any]] = {
    **NOT_FOUND,
    409: {
        "description": "The stored row is unusable (e.g. written with SQL; `errors` says why), "
        "or, with options.overlap skip or hold, the previous task is still queued or running"
    },
    503: {"description": "The target could not enqueue the task"},
}


@router.post(
    "/{schedule_id}/trigger",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=TriggerResult,
    responses=TRIGGER_RESPONSES,
    summary="Enqueue one task of this schedule now",
)
async def trigger(
    schedule_id: ScheduleId,
    request: Request,
    conn: Conn,
    now: Now,
    settings: AppSettings,
) -> TriggerResult:
    cfg = _usable(await load_row(request, conn, schedule_id))
    row_id = schedule_id
    # The slot part of the key, followed by a random part: two triggers never share a key.
    key = f"{cfg.name}:trigger:{slot_text(now)}:{uuid.uuid4().hex[:12]}"
    task = task_for(cfg, key, now, now + timedelta(seconds=settings.grace))
    target: Target = await get_target(request)
    extra = {"schedule": cfg.name, "idempotency_key": key}
    try:
        [result] = await target.enqueue([task], now)
        # A target may refuse one task alone (e.g. one target of a router is down).
        failure = (result.error or "failed") if result.status == "failed" else None
    except Exception as exc:
        failure = str(exc)
    else:
        if result.status == "busy":
            why = _previous_text(result)
            log.info("manual trigger of %s refused: %s", cfg.name, why, extra=extra)
            await _record(
                conn, settings, row_id, cfg.name, now, "skipped", None, f"trigger: overlap: {why}"
            )
            raise ApiProblem(
                409,
                "overlap",
                f"not enqueued: options.overlap is {cfg.options.get('overlap')!r} and {why}",
            )
    if failure is not None:
        log.error("manual trigger of %s failed: %s", cfg.name, failure, extra=extra)
        await _record(conn, settings, row_id, cfg.name, now, "failed", None, f"trigger: {failure}")
        raise ApiProblem(503, "target-unavailable", f"the task was not enqueued: {failure}")
    log.info("manual trigger of %s enqueued as %s", cfg.name, key, extra=extra)
    await _record(conn, settings, row_id, cfg.name, now, "triggered", result.message_id, None)
    return TriggerResult(
        task_id=task.id,
        idempotency_key=key,
        message_id=result.message_id,
        status=result.status,
        queue=task.queue,
        enqueued_at=now,
    )


def _usable(row: RowView) -> PeriodicTaskConfig:
    """The row's config, or 409 when a manager would not run it (the same judgement)."""
    cfg = row.config
    if cfg is None or not row.usable:
        field, reason = row.errors[0]
        raise ApiProblem(
            409,
            "unusable-schedule",
            f"the stored schedule is unusable: {field}: {reason}",
            errors=[config_error_item(ConfigError(field, reason))],
        )
    return cfg


BACKFILL_RESPONSES: dict[int | str, dict[str, Any]] = {
    **NOT_FOUND,
    409: {"description": "The schedule is paused, or its stored row is unusable"},
    422: {
        "description": "A bad `from`, `to`, `dry_run` or `force`, `to` not after `from` or "
        "after now, or more than 100,000 slots in the range (each error names the field)"
    },
}


@router.post(
    "/{schedule_id}/backfill",
    response_model=BackfillResult,
    responses=BACKFILL_RESPONSES,
    summary="Send every slot in [from, to) that was never sent, once, paced",
)
async def backfill(
    schedule_id: ScheduleId,
    body: BackfillIn,
    request: Request,
    now: Now,
    settings: AppSettings,
) -> BackfillResult:
    start, end = slot_backfill.parse_range(body.from_, body.to, now)
    # A connection of its own, returned before the slots go out (that may take minutes).
    async with get_state(request).database.connect() as conn:
        row = await load_row(request, conn, schedule_id)
    cfg = _usable(row)
    if row.enabled is False:
        raise ApiProblem(409, "paused", "the schedule is paused: resume it before a backfill")
    found = slot_backfill.slots_in(cfg, start, end)
    policy = slot_backfill.Policy.of(settings, dry_run=body.dry_run, force=body.force)
    outcome = await slot_backfill.backfill(
        get_state(request).database,
        cfg,
        await get_target(request),
        get_clock(request),
        found,
        policy,
        created_at=_instant(row.values.get("created_at")),
    )
    return BackfillResult(**dataclasses.asdict(outcome))


def _instant(value: Any) -> datetime | None:
    return value if isinstance(value, datetime) and value.tzinfo is not None else None


def _previous_text(result: EnqueueResult) -> str:
    prev = result.previous
    if prev is None or prev.task_id is None:
        return "the previous task is unfinished"
    return f"the previous task {prev.task_id} is {prev.state}"


async def _record(
    conn: Connection,
    settings: Settings,
    schedule_id: int,
    name: str,
    now: datetime,
    status_: str,
    message_id: str | None,
    error: str | None,
) -> None:
    if not settings.runs_max_per_schedule:
        return
    try:
        await history.record_trigger(conn, str(schedule_id), name, now, status_, message_id, error)
    except Exception as exc:  # the task is out already; history is for people
        log.warning("recording the trigger of %s failed: %s", name, exc, extra={"schedule": name})
