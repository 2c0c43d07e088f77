"""Limited runs: ``options.max_runs``.

A schedule with ``max_runs: N`` sends at most N of its scheduled slots, then ends (status
``ended``, as past ``options.end_at``). What counts is a distinct scheduled slot sent to the
target (enqueued, or found enqueued already): a slot skipped as late, held and expired, or failed
for good does not count; a manual trigger is no slot and never counts.

The count lives with the settled slot (``pm_schedule_state.runs_count`` beside ``last_done_at``,
written in the same statement): a slot counts once, when it is recorded sent after the latest
settled slot. A manager that registers a limited schedule (start, resume, takeover) takes its
runs left from that record, minus every slot of the schedule after the settled slot that it will
not send itself (:func:`periodic_manager.schedules.slots.count_between`): such a slot may have
been sent by a manager that died before recording it, so it is taken as used. So no restart, takeover or lost broker claim ever sends run
N+1.

Values (an integer from 1 to :data:`MAX_RUNS`) are checked by
:data:`periodic_manager.schedules.rules.OPTION_CHECKS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_RUNS = 1_000_000_000


def max_runs_of(options: Mapping[str, Any] | None) -> int | None:
    """``options.max_runs`` of checked options, or None (no limit)."""
    if not options:
        return None
    value = options.get("max_runs")
    return value if isinstance(value, int) else None


def runs_left(max_runs: int, counted: int) -> int:
    """Runs left of ``max_runs`` after ``counted`` (never below 0)."""
    return max(0, max_runs - max(0, counted))
