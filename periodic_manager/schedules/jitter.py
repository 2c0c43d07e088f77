"""A schedule's jitter: ``options.jitter``, seconds by which each slot's send is spread.

Each slot is *sent* at ``slot + offset``, ``0 <= offset < jitter``. The offset is a pure function
of the slot's idempotency key (``<name>:<slot in UTC>``): every manager, every restart and every
preview computes the same one, and a thousand ``@hourly`` schedules spread over the window instead
of landing in the same millisecond. The task itself is unchanged: its ``scheduled_at`` and its
idempotency key are the nominal slot. Jitter moves the send only; slots (previews, takeovers,
catch-up, rebase) are the nominal ones.

Rules (checked by :data:`periodic_manager.schedules.rules.OPTION_CHECKS` for the value, a number
of seconds like every duration, and against the schedule by the judge,
:func:`periodic_manager.schedules.judge.check_gap`, once the schedule is known):

* a number of seconds (int or float, not bool), ``> 0`` and at most ``MAX_DURATION_S``, checked
  by comparison before any arithmetic;
* less than the schedule's shortest gap between two slots: for ``@every N`` that is ``N``; for a
  cron spec, the shortest gap among the first ``GAP_SLOTS`` slots after the fixed
  ``GAP_REFERENCE`` (both in the judge) in the schedule's zone. A rarer, shorter gap (a
  daylight-saving change) is harmless: each slot is still sent once and in order, the next one possibly at once after
  the previous one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from periodic_manager.schedules.instants import slot_text

_US = 1_000_000


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
    return slot + timedelta(microseconds=offset_us(f"{name}:{slot_text(slot)}", jitter_us))


def offset_of(config: Any, slot: datetime) -> timedelta:
    """How long after ``slot`` the schedule ``config`` (a config or entry) sends it: its jitter
    offset, or zero without ``options.jitter``. Off the burst path (held slots, look-backs)."""
    jitter = jitter_of(config.options)
    if not jitter:
        return timedelta(0)
    return send_at(config.name, slot, jitter) - slot
