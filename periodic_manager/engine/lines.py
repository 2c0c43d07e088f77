"""Log lines that scale: what happens to many schedules at one instant is said in one line per
reason, with the count and a few names, never one line per schedule (a manager that fell behind
with a million schedules due at one instant would print a million lines). Each schedule's own
outcome stays in the run history and the metrics."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

# How many schedules a grouped line names.
NAMES_SHOWN = 5


def few(names: Sequence[str], shown: int = NAMES_SHOWN) -> str:
    """``names`` for a log line: all of them up to ``shown``, else the first ones and how many
    more (``a, b, c, d, e and 995 more``)."""
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} and {len(names) - shown:,} more"


def log_slots(
    logger: logging.Logger,
    level: int,
    what: str,
    slot: datetime,
    names: Sequence[str],
    why: str,
) -> None:
    """One line for the schedules ``names`` to which ``what`` happened at ``slot``, ``why``
    saying the reason: ``skipping 3 slot(s) due <slot>: <why>: a, b, c``. The slot, the count
    and the names shown are fields of the record too (``PM_LOG_FORMAT=json``)."""
    if not names:
        return
    at = slot.isoformat()
    logger.log(
        level,
        "%s %d slot(s) due %s: %s: %s",
        what,
        len(names),
        at,
        why,
        few(names),
        extra={"slot": at, "batch": len(names), "schedules": list(names[:NAMES_SHOWN])},
    )
