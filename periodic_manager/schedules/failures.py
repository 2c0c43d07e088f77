"""Pause on failure: ``options.pause_after_failures``.

A schedule with ``pause_after_failures: N`` pauses itself once N of its tasks in a row failed.
Only a target that can tell a failed task from a finished one offers it (a
:class:`~periodic_manager.contracts.FailureSignal`: Celery with a result backend, RQ, arq while it
keeps the job's result, procrastinate); on the others the option is refused with the reason, as
``options.overlap`` skip and hold are refused on a target without a completion signal.

What counts is the outcome of each task sent (the run history's message ids, oldest first): a
failed task adds one, a succeeded one resets the count to 0, one whose outcome is unknown (the
target no longer holds it, or it was stopped) counts neither way, and one still queued or running
is waited for (up to :data:`UNDECIDED_FOR`, after which it is taken as unknown). The count and the
slot of the last task counted live in ``pm_schedule_state`` (``consecutive_failures``,
``failures_checked_at``), so a restart, a takeover or a partition move goes on counting where the
last manager left off. The pause is written by the one schedule writer, by the source
``manager`` (its note says why; ``paused_by`` is ``manager``), and reaches the managers like any
edit.

Values (an integer from 1 to :data:`MAX_FAILURES`) are checked by
:data:`periodic_manager.schedules.rules.OPTION_CHECKS`; the walk over outcomes is :func:`count`, pure so that every store and test agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

# A task's outcome as a FailureSignal target tells it (contracts.FailureSignal.outcomes).
SUCCEEDED = "succeeded"
FAILED = "failed"
UNKNOWN = "unknown"  # the target no longer holds it, or it ended neither way (stopped, revoked)
PENDING = "pending"  # queued or running: not decided yet
OUTCOMES = (SUCCEEDED, FAILED, UNKNOWN, PENDING)

MAX_FAILURES = 1_000
# A task still queued or running this long after its slot is taken as unknown, so a task whose
# record the worker system lost (a Celery result that expired as PENDING) never stops the count.
UNDECIDED_FOR = timedelta(days=1)


def limit_of(options: Mapping[str, Any] | None) -> int | None:
    """``options.pause_after_failures`` of checked options, or None (not set)."""
    if not options:
        return None
    value = options.get("pause_after_failures")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class Counted:
    """Where a walk over outcomes ended: the consecutive failures, the slot of the last task
    decided (None: nothing new was decided) and the last failed task's id."""

    failures: int
    checked_at: datetime | None
    last_failed: str | None


def count(
    failures: int,
    runs: Sequence[tuple[datetime, str | None]],
    outcomes: Mapping[str, str],
    now: datetime,
) -> Counted:
    """Walk ``runs`` (slot, task id), oldest first, from ``failures`` consecutive failures:
    stop at the first task still pending (queued or running) (unless older than :data:`UNDECIDED_FOR`)."""
    checked: datetime | None = None
    last_failed: str | None = None
    failures = max(0, failures)
    for slot, task_id in runs:
        state = outcomes.get(task_id) if task_id is not None else None
        if state == PENDING and now - slot < UNDECIDED_FOR:
            break
        if state == FAILED:
            failures += 1
            last_failed = task_id
        elif state == SUCCEEDED:
            failures = 0
        checked = slot
    return Counted(failures, checked, last_failed)


def note(failures: int, last_failed: str | None) -> str:
    """The pause note the manager writes."""
    last = f" (last: {last_failed})" if last_failed else ""
    return f"paused by the manager after {failures} consecutive failed tasks{last}"
