"""Backfill: every slot of a schedule in ``[from, to)`` that was never sent, sent once now.

Run where it is asked (the API's ``POST /schedules/{id}/backfill``, the CLI's ``backfill``),
through the target the API's manual triggers use, not by a manager. Each slot goes out as the
manager would have sent it: its nominal ``scheduled_at`` and idempotency key (``<name>:<slot>``).
Paced at ``PM_CATCHUP_RATE`` slots a second (:func:`periodic_manager.pacing.paced`).

The slots are the schedule's slots within ``options.start_at`` / ``end_at``, as the engine's:
a slot on a date ``options.exclude`` holds is not sent (counted ``excluded``), and a schedule with
``options.max_runs`` sends no more than its runs left (counted ``over_limit``; the sent slots use
runs, in ``pm_schedule_state.runs_count`` as a manager's do). Unlike a manager's look back, a
backfill may reach before the row's ``effective_at`` (that is what it is asked for).

Exactly once, and remembered:

* Each batch claims its slots in ``pm_backfill_slots`` just before sending them
  (:func:`periodic_manager.db.backfill_slots.claim`, in the same transaction as a fresh read of the
  run history): of two backfills racing over one range, whatever their rates, only one sends a
  slot, and one a manager sent meanwhile is not sent again. The target's claim of the key is the
  last guard (a slot it answers ``duplicate`` for is counted already sent).
* A sent slot stays recorded there for ``PM_RUNS_RETENTION`` whatever the history's cap per
  schedule, so a broker that forgot its claims does not get it again from another backfill; and
  the schedule's settled slot (``pm_schedule_state.last_done_at``) moves over every slot sent up
  to the first one still missing, so no takeover or catch-up of a manager sends them again.
* What cannot be known is said, not guessed: a slot older than what is remembered (before
  ``now - PM_RUNS_RETENTION``, or at or before the oldest slot of a history at its cap,
  ``PM_RUNS_MAX_PER_SCHEDULE``) is counted ``unchecked`` and sent only with ``force``. Slots before
  the row's ``created_at`` were never sent by a manager: while the row is younger than the
  retention, the backfill records alone know them.

A dry run reads the same and sends nothing (the target's claims are not asked). ``options.overlap``
skip and hold apply: a slot the target answers ``busy`` for is recorded ``skipped`` (a backfill
holds nothing). Sent slots are recorded ``backfilled`` in the run history.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any, NamedTuple

from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.contracts import Clock, Target, Task
from periodic_manager.db import backfill_slots, history, store_reads
from periodic_manager.db.backfill_slots import BACKFILLED, KNOWN_SENT
from periodic_manager.engine.entries import window_of
from periodic_manager.errors import ConfigError, cause
from periodic_manager.pacing import paced
from periodic_manager.schedules.bounds import parse_instant
from periodic_manager.schedules.definition import PeriodicTaskConfig, idempotency_key
from periodic_manager.schedules.rules import overlap_policy
from periodic_manager.schedules.runs import max_runs_of, runs_left
from periodic_manager.schedules.slots import Rule, walk
from periodic_manager.settings import Settings
from periodic_manager.targets.base import task_for

__all__ = [
    "BACKFILLED",
    "MAX_SLOTS",
    "Outcome",
    "Policy",
    "Range",
    "backfill",
    "parse_range",
    "slots_in",
]

log = logging.getLogger(__name__)

MAX_SLOTS = 100_000  # slots of one request
_TICK = timedelta(microseconds=1)
_Row = tuple[datetime, str, datetime, str | None, str | None]  # a history row (record_api_runs)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a backfill did. Of the ``slots`` in the range, ``excluded`` fall on a date
    ``options.exclude`` holds; ``already_sent`` were known sent (history, backfill records, the
    settled slot, another backfill's claim or the target's); ``unchecked`` are older than what
    is remembered (sent only when ``forced``); ``to_send`` were not known sent before the run (a
    dry run stops there). Of those, ``sent`` went out, ``over_limit`` were beyond
    ``options.max_runs``, ``skipped`` were refused by ``options.overlap`` and ``failed`` the target
    did not take."""

    slots: int
    excluded: int
    already_sent: int
    unchecked: int
    to_send: int
    sent: int
    over_limit: int
    skipped: int
    failed: int
    dry_run: bool
    forced: bool


@dataclass(frozen=True, slots=True)
class Policy:
    """How a backfill runs: its pace, the claim window of its tasks (grace, catch-up window),
    what the run history remembers (``retention``, ``history_cap`` rows per schedule; 0: no
    history is written), and the caller's ``dry_run`` and ``force``."""

    rate: float
    grace: float
    catchup_window: float
    retention: timedelta
    history_cap: int
    dry_run: bool = False
    force: bool = False

    @classmethod
    def of(cls, settings: Settings, *, dry_run: bool, force: bool) -> Policy:
        return cls(
            rate=settings.catchup_rate,
            grace=settings.grace,
            catchup_window=settings.catchup_window,
            retention=timedelta(days=settings.runs_retention),
            history_cap=settings.runs_max_per_schedule,
            dry_run=dry_run,
            force=force,
        )


class Range(NamedTuple):
    """The slots of a range that are sent (UTC, in order) and how many ``options.exclude``
    left out."""

    slots: list[datetime]
    excluded: int


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


def slots_in(config: PeriodicTaskConfig, start: datetime, end: datetime) -> Range:
    """The schedule's slots in ``[start, end)`` within its bounds, those on a date its
    ``options.exclude`` holds counted apart; ConfigError naming ``to`` when there are more than
    :data:`MAX_SLOTS` (excluded ones count)."""
    try:
        sent, excluded = Rule.of(config).between(start, end, MAX_SLOTS)
    except OverflowError:
        raise ConfigError(
            "to", f"the range holds more than {MAX_SLOTS:,} slots: backfill it in parts"
        ) from None
    return Range(sent, excluded)


@dataclass(slots=True)
class _Plan:
    todo: list[datetime]  # to claim and send, in order
    known: int  # known sent at the start
    unchecked: int  # older than what is remembered
    runs_left: int | None  # options.max_runs: the runs left at the start


async def _plan(
    engine: AsyncEngine,
    config: PeriodicTaskConfig,
    slots: list[datetime],
    now: datetime,
    policy: Policy,
    created_at: datetime | None,
) -> _Plan:
    """What the database knows of ``slots`` at the start: which were sent, which cannot be
    checked, what is left to send."""
    key = str(config.schedule_id)
    lo, hi = slots[0], slots[-1] + _TICK
    async with engine.connect() as conn:
        known = await history.slots_with(conn, key, KNOWN_SENT, lo, hi)
        known |= await backfill_slots.recorded(conn, key, lo, hi)
        state = (await store_reads.states(conn, [key])).get(key)
        kept = await history.kept(conn, key) if policy.history_cap else (0, None)
    last = state.last_slot_at.astimezone(UTC) if state is not None and state.last_slot_at else None
    if last is not None:
        known.add(last)
    checkable = _remembered(now, created_at, policy, kept, last)
    todo: list[datetime] = []
    unchecked = 0
    for slot in slots:
        if slot in known:
            continue
        if not checkable(slot):
            unchecked += 1
            if not policy.force:
                continue
        todo.append(slot)
    limit = max_runs_of(config.options)
    left = None if limit is None else runs_left(limit, state.runs if state is not None else 0)
    return _Plan(todo, len(slots) - len(todo) - (0 if policy.force else unchecked), unchecked, left)


def _remembered(
    now: datetime,
    created_at: datetime | None,
    policy: Policy,
    kept: tuple[int, datetime | None],
    last_sent: datetime | None,
) -> Callable[[datetime], bool]:
    """Whether the database still knows if a slot was sent: the run history (live slots) keeps
    the retention unless its cap dropped older rows; the backfill records keep the retention."""
    forgotten = now - policy.retention
    young = created_at is not None and created_at >= forgotten
    count, oldest = kept
    capped = oldest if policy.history_cap and count >= policy.history_cap else None

    def checkable(slot: datetime) -> bool:
        if young and created_at is not None and slot < created_at:
            return True  # no manager sent it; every backfill of the row is still recorded
        if slot < forgotten:
            return False
        if not policy.history_cap:  # no history: the latest slot sent is all that is known
            return last_sent is None or slot > last_sent
        return capped is None or slot > capped

    return checkable


async def backfill(
    engine: AsyncEngine,
    config: PeriodicTaskConfig,
    target: Target,
    clock: Clock,
    found: Range,
    policy: Policy,
    *,
    created_at: datetime | None = None,
) -> Outcome:
    """Send every slot of ``found`` (from :func:`slots_in`) not known sent (see the module doc);
    ``created_at``: the row's (None: unknown)."""
    slots = found.slots
    plan = (
        _Plan([], 0, 0, None)
        if not slots
        else await _plan(engine, config, slots, clock.now(), policy, created_at)
    )
    counts: Counter[str] = Counter()
    if policy.dry_run:
        if plan.runs_left is not None:
            counts["over_limit"] = max(0, len(plan.todo) - plan.runs_left)
    elif plan.todo:
        await _send_all(engine, config, target, clock, plan.todo, policy, counts)
        await _settle(engine, config, plan.todo[-1] + _TICK, clock.now())
    out = Outcome(
        slots=len(slots) + found.excluded,
        excluded=found.excluded,
        already_sent=plan.known + counts["duplicate"],
        unchecked=plan.unchecked,
        to_send=len(plan.todo),
        sent=counts["sent"],
        over_limit=counts["over_limit"],
        skipped=counts["skipped"],
        failed=counts["failed"],
        dry_run=policy.dry_run,
        forced=policy.force,
    )
    if not policy.dry_run:
        log.info(
            "backfill of %s: %d slot(s), %d sent, %d already sent, %d excluded, %d unchecked, "
            "%d over max_runs, %d skipped, %d failed",
            config.name,
            out.slots,
            out.sent,
            out.already_sent,
            out.excluded,
            out.unchecked,
            out.over_limit,
            out.skipped,
            out.failed,
            extra={"schedule": config.name},
        )
    return out


async def _send_all(
    engine: AsyncEngine,
    config: PeriodicTaskConfig,
    target: Target,
    clock: Clock,
    todo: list[datetime],
    policy: Policy,
    counts: Counter[str],
) -> None:
    """Claim, send and record ``todo`` batch by batch at the policy's pace."""
    key = str(config.schedule_id)
    owner = f"backfill:{uuid.uuid4().hex}"
    limit = max_runs_of(config.options)
    window = window_of(
        config, timedelta(seconds=policy.grace), timedelta(seconds=policy.catchup_window)
    )
    one_by_one = overlap_policy(config.options) != "allow"  # the target judges each in turn
    async for batch in paced(clock, policy.rate, todo):
        now = clock.now()
        claimed = await backfill_slots.claim(engine, key, config.name, batch, owner, now, limit)
        counts["duplicate"] += len(claimed.known)
        counts["over_limit"] += claimed.over_limit
        if not claimed.mine:
            continue
        tasks = [
            task_for(config, idempotency_key(config.name, s), s, now + window) for s in claimed.mine
        ]
        rows: list[_Row] = []
        sent: list[datetime] = []
        for part in ([t] for t in tasks) if one_by_one else [tasks]:
            rows += await _send(target, part, now, counts, sent)
        unsent = set(claimed.mine) - set(sent)
        try:
            await backfill_slots.finish(
                engine, key, owner, sent, unsent, clock.now(), limited=limit is not None
            )
        except Exception as exc:  # the claims stay 'sending': taken over after STALE, same keys
            log.warning(
                "recording what the backfill of %s sent failed: %s", config.name, cause(exc)
            )
        if policy.history_cap and rows:
            try:
                async with engine.connect() as conn:
                    await history.record_api_runs(conn, key, config.name, rows)
            except Exception as exc:  # the tasks are out already; history is for people
                log.warning("recording the backfill of %s failed: %s", config.name, cause(exc))


async def _send(
    target: Target, tasks: list[Task], now: datetime, counts: Counter[str], sent: list[datetime]
) -> list[_Row]:
    """Enqueue ``tasks``; the history rows of their outcomes (a slot found claimed has none:
    it was recorded when it was sent). The slots the target took or held go to ``sent``."""
    try:
        results = await target.enqueue(tasks, now)
    except Exception as exc:
        counts["failed"] += len(tasks)
        return [(t.scheduled_at, "failed", now, None, f"backfill: {exc}") for t in tasks]
    rows: list[_Row] = []
    for task, result in zip(tasks, results, strict=True):
        if result.status in ("enqueued", "resent"):
            counts["sent"] += 1
            sent.append(task.scheduled_at)
            rows.append((task.scheduled_at, BACKFILLED, now, result.message_id, None))
        elif result.status == "duplicate":
            counts["duplicate"] += 1
            sent.append(task.scheduled_at)
        elif result.status == "busy":
            counts["skipped"] += 1
            rows.append(
                (
                    task.scheduled_at,
                    "skipped",
                    now,
                    None,
                    "backfill: overlap: the previous task is unfinished",
                )
            )
        else:
            counts["failed"] += 1
            rows.append(
                (task.scheduled_at, "failed", now, None, f"backfill: {result.error or 'failed'}")
            )
    return rows


async def _settle(
    engine: AsyncEngine, config: PeriodicTaskConfig, end: datetime, now: datetime
) -> None:
    """Move the schedule's settled slot over every slot before ``end`` known sent, from the
    settled slot (or the row's ``effective_at``) up to the first one missing; nothing when the
    first slot after it is missing. Excluded slots are passed over, as a manager skips them."""
    key = str(config.schedule_id)
    try:
        async with engine.connect() as conn:
            state = (await store_reads.states(conn, [key])).get(key)
            base = (
                state.last_done_at
                if state is not None and state.last_done_at
                else config.effective_at
            )
            if base is None or base >= end:
                return
            sent = await history.slots_with(conn, key, KNOWN_SENT, base, end)
            sent |= await backfill_slots.recorded(
                conn, key, base, end, state=backfill_slots.SENT_STATE
            )
        rule, last = Rule.of(config), None
        for slot in islice(walk(rule.schedule, base, rule.bounds), MAX_SLOTS + 1):
            if slot >= end:
                break
            if rule.excluded(slot) is not None:
                continue
            if slot.astimezone(UTC) not in sent:
                break
            last = slot
        if last is not None:
            await backfill_slots.settle(engine, key, config.name, last.astimezone(UTC), now)
    except Exception as exc:  # what was sent is recorded; the settled slot is a shortcut
        log.warning("settling the backfill of %s failed: %s", config.name, cause(exc))
