"""A schedule's jitter: ``options.jitter``, seconds by which each slot's send is spread.

Each slot is *sent* at ``slot + offset``, ``0 <= offset < jitter``. The offset is a pure function
of the slot's idempotency key (``<name>:<slot in UTC>``): every manager, every restart and every
preview computes the same one, and a thousand ``@hourly`` schedules spread over the window instead
of landing in the same millisecond. The task itself is unchanged: its ``scheduled_at`` and its
idempotency key are the nominal slot. Jitter moves the send only; slots (previews, takeovers,
catch-up, rebase) are the nominal ones.

Rules (checked by :data:`periodic_manager.schedules.rules.OPTION_CHECKS` for the value and by
:func:`check_gap` against the schedule):

* a number of seconds (int or float, not bool), ``> 0`` and at most ``MAX_DURATION_S``, checked
  by comparison before any arithmetic;
* less than the schedule's shortest gap between two slots: for ``@every N`` that is ``N``; for a
  cron spec, the shortest gap among the first :data:`GAP_SLOTS` slots after the fixed
  :data:`GAP_REFERENCE` in the schedule's zone. A rarer, shorter gap (a daylight-saving change)
  is harmless: each slot is still sent once and in order, the next one possibly at once after
  the previous one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from periodic_manager import cron
from periodic_manager.errors import ConfigError

FIELD = "options.jitter"
GAP_SLOTS = 64  # slots after GAP_REFERENCE whose gaps a cron spec's jitter must stay under
GAP_REFERENCE = datetime(2001, 1, 1, tzinfo=cron.UTC)  # fixed: every judge answers alike
_US = 1_000_000


def check_value(value: Any, max_seconds: int) -> None:
    """ValueError (the reason, without the field) unless ``0 < value <= max_seconds``, a number."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value <= max_seconds
    ):
        raise ValueError(f"must be a number of seconds > 0 and at most {max_seconds} (366 days)")


@lru_cache(maxsize=4096)
def shortest_gap(schedule: cron.Schedule) -> timedelta | None:
    """The schedule's shortest gap between slots (see the module docstring), or None when it
    has fewer than two slots after the reference (no gap to stay under)."""
    if isinstance(schedule, cron.EverySchedule):
        return timedelta(microseconds=schedule.spec.period_us)
    gap: timedelta | None = None
    try:
        prev = schedule.next_after(GAP_REFERENCE)
        for _ in range(GAP_SLOTS - 1):
            at = schedule.next_after(prev)
            if gap is None or at - prev < gap:
                gap = at - prev
            prev = at
    except (OverflowError, ValueError, ArithmeticError):
        pass  # fewer slots: the gaps found so far
    return gap


def check_gap(schedule: cron.Schedule, options: Mapping[str, Any] | None) -> None:
    """ConfigError naming ``options.jitter`` when it is not less than the shortest gap."""
    if not options or "jitter" not in options:
        return
    jitter = options["jitter"]  # checked by the option table: a number within bounds
    gap = shortest_gap(schedule)
    if gap is not None and jitter * _US >= gap // timedelta(microseconds=1):
        raise ConfigError(
            FIELD,
            f"must be less than the schedule's shortest gap between slots "
            f"({gap.total_seconds():g} s)",
        )


def jitter_of(options: Mapping[str, Any] | None) -> int:
    """The jitter of checked options in microseconds (0: none)."""
    if not options:
        return 0
    value = options.get("jitter")
    if value is None:
        return 0
    return int(value * _US)


def offset_us(key: str, jitter_us: int) -> int:
    """The send offset of the slot whose idempotency key is ``key``: in ``[0, jitter_us)``
    (0 when ``jitter_us`` is 0), the same on every manager."""
    if jitter_us <= 0:
        return 0
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") * jitter_us >> 64


def send_at(name: str, slot: datetime, jitter_us: int) -> datetime:
    """When the slot ``slot`` of schedule ``name`` is sent: ``slot + offset``."""
    from periodic_manager.schedules.definition import slot_text  # definition imports rules

    return slot + timedelta(microseconds=offset_us(f"{name}:{slot_text(slot)}", jitter_us))


def offset_of(config: Any, slot: datetime) -> timedelta:
    """How long after ``slot`` the schedule ``config`` (a config or entry) sends it: its jitter
    offset, or zero without ``options.jitter``. Off the burst path (held slots, look-backs)."""
    jitter = jitter_of(config.options)
    if not jitter:
        return timedelta(0)
    return send_at(config.name, slot, jitter) - slot
