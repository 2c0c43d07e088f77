"""Limited runs: ``options.max_runs``.

A schedule with ``max_runs: N`` sends at most N of its scheduled slots, then ends (status
``ended``, as past ``options.end_at``). What counts is a distinct scheduled slot sent to the
target (enqueued, or found enqueued already): a slot skipped as late, held and expired, or failed
for good does not count; a manual trigger is no slot and never counts.

The count lives with the settled slot (``pm_schedule_state.runs_count`` beside ``last_done_at``,
written in the same statement): a slot counts once, when it is recorded sent after the latest
settled slot. A manager that registers a limited schedule (start, resume, takeover) takes its
runs left from that record, minus every slot of the schedule after the settled slot that it will
not send itself (:func:`uncounted`): such a slot may have been sent by a manager that died before
recording it, so it is taken as used. So no restart, takeover or lost broker claim ever sends run
N+1.

Values (an integer from 1 to :data:`MAX_RUNS`) are checked by
:data:`periodic_manager.schedules.rules.OPTION_CHECKS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from periodic_manager import cron
from periodic_manager.schedules.bounds import Bounds, bounded_next

MAX_RUNS = 1_000_000_000
T = TypeVar("T")


def max_runs_of(options: Mapping[str, Any] | None) -> int | None:
    """``options.max_runs`` of checked options, or None (no limit)."""
    if not options:
        return None
    value = options.get("max_runs")
    return value if isinstance(value, int) else None


def runs_left(max_runs: int, counted: int) -> int:
    """Runs left of ``max_runs`` after ``counted`` (never below 0)."""
    return max(0, max_runs - max(0, counted))


def uncounted(
    schedule: cron.Schedule, after: datetime | None, until: datetime, bounds: Bounds, cap: int
) -> int:
    """How many slots within ``bounds`` lie in ``(after, until]``, counting at most ``cap``
    (a registration needs no more): the slots after the latest settled slot that the registering
    manager will not send. ``after`` None: none (nothing was ever settled, nothing counted)."""
    if after is None or until <= after or cap <= 0:
        return 0
    found, at = 0, after
    while found < cap:
        try:
            slot = bounded_next(schedule, at, bounds)
        except (OverflowError, ValueError, ArithmeticError):
            break
        if slot is None or slot > until:
            break
        found += 1
        at = slot
    return found


def limited(slots: Sequence[T], left: int | None) -> list[T]:
    """The first ``left`` of ``slots`` (all of them without a limit): a preview shows no slot
    past the last run."""
    return list(slots) if left is None else list(slots[:left])


def limited_sent(slots: Sequence[T], left: int | None, excluded: Callable[[T], bool]) -> list[T]:
    """:func:`limited` for a preview that also shows slots that are not sent (``excluded``:
    options.exclude): they use no run, and are shown up to the last run."""
    if left is None:
        return list(slots)
    out: list[T] = []
    for slot in slots:
        if not excluded(slot):
            if left <= 0:
                break
            left -= 1
        out.append(slot)
    return out
