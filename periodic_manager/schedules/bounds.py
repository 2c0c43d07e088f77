"""A schedule's bounds: ``options.start_at`` and ``options.end_at``.

No slot before ``start_at`` (a slot exactly at it counts), none at or after ``end_at``. This
module parses and checks them; the slot rule applies them (:mod:`periodic_manager.schedules.slots`,
the one home of every surface's slots).

Values are checked by :data:`periodic_manager.schedules.rules.OPTION_CHECKS` (:func:`check_instant`)
before any config holds them; :func:`bounds_of` only parses what was checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

from periodic_manager import cron

# The range of a bound, as of an anchor: far enough inside datetime's range that a bound minus a
# tick, or a bound in UTC or in any zone, never overflows.
BOUND_MIN = cron.ANCHOR_MIN
BOUND_MAX = cron.ANCHOR_MAX
MAX_TEXT = 64  # longer text is no instant


class Bounds(NamedTuple):
    start_at: datetime | None
    end_at: datetime | None


NO_BOUNDS = Bounds(None, None)


def parse_instant(value: Any) -> datetime:
    """``value`` as an aware instant; ValueError (the reason, without the field) otherwise.

    A string, ISO 8601 with an explicit UTC offset (``Z`` or ``+hh:mm``), between
    :data:`BOUND_MIN` and :data:`BOUND_MAX` UTC. The range is checked by comparison of aware
    datetimes, which never overflows, before any arithmetic."""
    if not isinstance(value, str):
        raise ValueError("must be a string: an ISO 8601 instant with a UTC offset")
    if not value or len(value) > MAX_TEXT or not value.isascii():
        raise ValueError(
            f"must be an ISO 8601 instant with a UTC offset, such as 2026-01-01T00:00:00Z "
            f"(got {value[:MAX_TEXT]!r})"
        )
    try:
        at = datetime.fromisoformat(value)  # 3.11: "Z", years 0001-9999 only, else ValueError
    except ValueError:
        raise ValueError(
            f"must be an ISO 8601 instant with a UTC offset, such as 2026-01-01T00:00:00Z "
            f"(got {value!r})"
        ) from None
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(
            f"must have an explicit UTC offset ('Z' or '+hh:mm'): {value!r} is a local time "
            "without one (naive), which is no instant"
        )
    if not BOUND_MIN <= at <= BOUND_MAX:
        raise ValueError(f"must be between {BOUND_MIN.date()} and {BOUND_MAX.date()} UTC")
    return at.astimezone(cron.UTC)


def check_instant(value: Any) -> None:
    """The option check of ``start_at`` and ``end_at`` (see :func:`parse_instant`)."""
    parse_instant(value)


def bounds_of(options: Mapping[str, Any] | None) -> Bounds:
    """The bounds of checked options (NO_BOUNDS when neither is set)."""
    if not options:
        return NO_BOUNDS
    start, end = options.get("start_at"), options.get("end_at")
    if start is None and end is None:
        return NO_BOUNDS
    return Bounds(
        parse_instant(start) if start is not None else None,
        parse_instant(end) if end is not None else None,
    )
