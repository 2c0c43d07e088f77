"""Backfill: every slot of a schedule in ``[from, to)`` that was never sent, sent once now.

Run where it is asked (the API's ``POST /schedules/{id}/backfill``, the CLI's ``backfill``),
through the target the API's manual triggers use, not by a manager. Each slot goes out as the
manager would have sent it: its nominal ``scheduled_at`` and idempotency key
(``<name>:<slot>``), so the target's claim of the key dedupes it against the manager and against
another backfill. Paced at ``PM_CATCHUP_RATE`` slots a second (:func:`periodic_manager.pacing.paced`).

A slot counts as already sent, and is not sent again, when

* the run history (``pm_runs``) records it sent (``enqueued``, ``duplicate``, ``resent`` or
  ``backfilled``),
* it is the latest slot the runtime state records as sent (``pm_schedule_state.last_slot_at``),
* or the target still holds the claim of its key (it answers ``duplicate``).

The limit, honestly: a slot whose claim expired (claims live for the schedule's window) and
whose history row was pruned (``PM_RUNS_RETENTION``, ``PM_RUNS_MAX_PER_SCHEDULE``) cannot be
known as sent, and is sent again. A dry run consults the history and the state only (asking the
target would claim the key), so its ``to_send`` may count slots a real run finds claimed.

Slots follow the schedule's current timing within ``options.start_at`` / ``end_at``; unlike a
manager's look back, a backfill may reach before the row's ``effective_at`` (that is what it is
asked for). ``options.overlap`` skip and hold apply: a slot the target answers ``busy`` for is
recorded ``skipped`` (a backfill holds nothing). Sent slots are recorded ``backfilled``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.contracts import SENT, Clock, Target, Task
from periodic_manager.db import history, store_reads
from periodic_manager.engine.entries import window_of
from periodic_manager.errors import ConfigError
from periodic_manager.pacing import paced
from periodic_manager.schedules.bounds import bounded_next, bounds_of, parse_instant
from periodic_manager.schedules.definition import PeriodicTaskConfig, idempotency_key
from periodic_manager.schedules.rules import overlap_policy
from periodic_manager.targets.base import task_for

log = logging.getLogger(__name__)

MAX_SLOTS = 100_000  # slots of one request
BACKFILLED = "backfilled"  # the run status of a slot a backfill sent
KNOWN_SENT = (*sorted(SENT), BACKFILLED)
_TICK = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a backfill did: ``slots`` in the range, of which ``already_sent`` were known sent
    (history, state or the target's claim), ``to_send`` were not known sent before the run (a
    dry run stops there), ``sent`` went out, ``skipped`` were refused by ``options.overlap``
    and ``failed`` the target could not take."""

    slots: int
    already_sent: int
    to_send: int
    sent: int
    skipped: int
    failed: int
    dry_run: bool


def parse_range(start: Any, end: Any, now: datetime) -> tuple[datetime, datetime]:
    """``from`` and ``to`` as instants; ConfigError names ``from`` or ``to``."""
    try:
        lo = parse_instant(start)
    except ValueError as exc:
        raise ConfigError("from", str(exc)) from None
    try:
        hi = parse_instant(end)
    except ValueError as exc:
        raise ConfigError("to", str(exc)) from None
    if hi <= lo:
        raise ConfigError("to", "must be after from")
    if hi > now:
        raise ConfigError(
            "to",
            f"must not be after now ({now.astimezone(UTC).isoformat()}): slots after now are "
            "not backfilled, the managers send them",
        )
    return lo.astimezone(UTC), hi.astimezone(UTC)


def slots_in(config: PeriodicTaskConfig, start: datetime, end: datetime) -> list[datetime]:
    """The schedule's slots in ``[start, end)`` within its bounds; ConfigError naming ``to``
    when there are more than :data:`MAX_SLOTS`."""
    bounds = bounds_of(config.options)
    out: list[datetime] = []
    at = start - _TICK
    while True:
        try:
            found = bounded_next(config.schedule, at, bounds)
        except (OverflowError, ValueError, ArithmeticError):
            break
        if found is None or found >= end:
            break
        if len(out) == MAX_SLOTS:
            raise ConfigError(
                "to", f"the range holds more than {MAX_SLOTS:,} slots: backfill it in parts"
            )
        out.append(found.astimezone(UTC))
        at = found
    return out


async def backfill(
    engine: AsyncEngine,
    config: PeriodicTaskConfig,
    target: Target,
    clock: Clock,
    slots: list[datetime],
    *,
    dry_run: bool,
    rate: float,
    grace: float,
    catchup_window: float,
    record: bool = True,
) -> Outcome:
    """Send every slot of ``slots`` (from :func:`slots_in`) not known sent (see the module doc);
    ``record``: write the outcomes to the run history."""
    key = str(config.schedule_id)
    if slots:
        async with engine.connect() as conn:
            known = await history.slots_with(conn, key, KNOWN_SENT, slots[0], slots[-1] + _TICK)
            state = (await store_reads.states(conn, [key])).get(key)
        if state is not None and state.last_slot_at is not None:
            known.add(state.last_slot_at.astimezone(UTC))
    else:
        known = set()
    todo = [s for s in slots if s not in known]
    if dry_run:
        return Outcome(len(slots), len(slots) - len(todo), len(todo), 0, 0, 0, True)
    window = window_of(config, timedelta(seconds=grace), timedelta(seconds=catchup_window))
    one_by_one = overlap_policy(config.options) != "allow"  # the target judges each in turn
    counts = {"sent": 0, "duplicate": 0, "skipped": 0, "failed": 0}
    async for batch in paced(clock, rate, todo):
        now = clock.now()
        tasks = [task_for(config, idempotency_key(config.name, s), s, now + window) for s in batch]
        rows: list[tuple[datetime, str, datetime, str | None, str | None]] = []
        for part in ([t] for t in tasks) if one_by_one else [tasks]:
            rows += await _send(target, part, now, counts)
        if record and rows:
            try:
                async with engine.connect() as conn:
                    await history.record_api_runs(conn, key, config.name, rows)
            except Exception as exc:  # the tasks are out already; history is for people
                log.warning("recording the backfill of %s failed: %s", config.name, exc)
    log.info(
        "backfill of %s: %d slot(s), %d sent, %d already sent, %d skipped, %d failed",
        config.name, len(slots), counts["sent"], len(slots) - len(todo) + counts["duplicate"],
        counts["skipped"], counts["failed"], extra={"schedule": config.name},
    )  # fmt: skip
    return Outcome(
        slots=len(slots),
        already_sent=len(slots) - len(todo) + counts["duplicate"],
        to_send=len(todo),
        sent=counts["sent"],
        skipped=counts["skipped"],
        failed=counts["failed"],
        dry_run=False,
    )


async def _send(
    target: Target, tasks: list[Task], now: datetime, counts: dict[str, int]
) -> list[tuple[datetime, str, datetime, str | None, str | None]]:
    """Enqueue ``tasks``; the history rows of their outcomes (a slot found claimed has none:
    it was recorded when it was sent)."""
    try:
        results = await target.enqueue(tasks, now)
    except Exception as exc:
        counts["failed"] += len(tasks)
        return [(t.scheduled_at, "failed", now, None, f"backfill: {exc}") for t in tasks]
    rows: list[tuple[datetime, str, datetime, str | None, str | None]] = []
    for task, result in zip(tasks, results, strict=True):
        if result.status in ("enqueued", "resent"):
            counts["sent"] += 1
            rows.append((task.scheduled_at, BACKFILLED, now, result.message_id, None))
        elif result.status == "duplicate":
            counts["duplicate"] += 1
        elif result.status == "busy":
            counts["skipped"] += 1
            rows.append((task.scheduled_at, "skipped", now, None, "backfill: overlap: the previous task is unfinished"))
        else:
            counts["failed"] += 1
            rows.append((task.scheduled_at, "failed", now, None, f"backfill: {result.error or 'failed'}"))
    return rows

