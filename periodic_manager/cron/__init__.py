"""The cron engine: parse expressions, bind them to IANA zones, find fire instants.

Pure: no I/O of its own (zone data comes through ``zoneinfo``), never reads the clock.
Semantics: ``docs/cron.md`` (five fields, names, macros, ``@every``,
the Vixie day rule, DST by the hour field, no search horizon).

Usage::

    from periodic_manager.cron import next_fires, parse
    next_fires("30 2 * * *", after, n=3, tz="Europe/Berlin")   # list of aware UTC datetimes
    sched = parse("*/5 * * * *", tz="Europe/Berlin")            # cached, shared
    slot = sched.next_after(last_slot)

Caching: the expression text is parsed once (zone-independent), and each
``(expression, zone, anchor)`` triple yields one shared :class:`Schedule`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache

from periodic_manager.cron.days import DayTable
from periodic_manager.cron.errors import CronError, NaiveDatetimeError
from periodic_manager.cron.parser import CronSpec, EverySpec, parse_spec
from periodic_manager.cron.schedule import CronSchedule, EverySchedule, Schedule
from periodic_manager.cron.zones import Zone

__all__ = [
    "ANCHOR_MAX",
    "ANCHOR_MIN",
    "UTC",
    "CronError",
    "CronSchedule",
    "EverySchedule",
    "Schedule",
    "clear_caches",
    "next_fires",
    "parse",
    "validate",
]

_SCHEDULES_MAX = 100_000
#: The instants an anchor may be: a day inside datetime's range at both ends, so that the anchor
#: in UTC or in any zone is representable.
ANCHOR_MIN = datetime(1, 1, 2, tzinfo=UTC)
ANCHOR_MAX = datetime(9999, 12, 30, tzinfo=UTC)


@lru_cache(maxsize=_SCHEDULES_MAX)
def _spec(expr: str) -> CronSpec | EverySpec:
    """The parsed expression, shared by :func:`validate` and every zone."""
    return parse_spec(expr)


@lru_cache(maxsize=_SCHEDULES_MAX)
def _compile(expr: str) -> tuple[CronSpec, DayTable] | EverySpec:
    """Zone-independent part, shared by every zone: the spec and its day table."""
    spec = _spec(expr)
    if isinstance(spec, EverySpec):
        return spec
    return spec, DayTable(spec)


@lru_cache(maxsize=1024)
def _zone(name: str) -> Zone:
    return Zone(name)


@lru_cache(maxsize=_SCHEDULES_MAX)
def _schedule(expr: str, tz: str, anchor: datetime | None) -> Schedule:
    _check_types(expr, tz, anchor)  # only on a miss: hits were valid when cached
    compiled = _compile(expr)
    zone = _zone(tz)  # an unknown zone is an error even for @every
    if isinstance(compiled, EverySpec):
        return EverySchedule(compiled, tz, anchor)
    spec, table = compiled
    return CronSchedule(spec, table, zone)


def _check_types(expr: object, tz: object, anchor: object) -> None:
    # Checked before the caches, which need hashable keys and must not keep junk.
    if not isinstance(expr, str):
        raise CronError("expression", "syntax", f"must be a string, not {type(expr).__name__}")
    if not isinstance(tz, str):
        raise CronError("timezone", "unknown-zone", f"must be a zone name, not {type(tz).__name__}")
    if anchor is not None:
        if not isinstance(anchor, datetime):
            raise TypeError(f"anchor must be a datetime, not {type(anchor).__name__}")
        if anchor.tzinfo is None or anchor.utcoffset() is None:
            raise NaiveDatetimeError(
                "anchor", "naive-datetime", "must be timezone-aware (an instant)"
            )
        # Aware comparisons never overflow; converting an anchor near the ends of datetime's
        # range to UTC (year 1 at +14:00) or to a local time would.
        if not ANCHOR_MIN <= anchor <= ANCHOR_MAX:
            raise CronError(
                "anchor",
                "out-of-range",
                f"must be between {ANCHOR_MIN.date()} and {ANCHOR_MAX.date()} UTC",
            )


def parse(expr: str, tz: str = "UTC", anchor: datetime | None = None) -> Schedule:
    """The schedule of ``expr`` in zone ``tz``; identical arguments return the same object.

    ``anchor`` (an aware instant) sets the phase of ``@every`` (default: the Unix epoch);
    cron expressions ignore it. Raises :class:`CronError` for an invalid expression,
    an unknown zone, or an anchor that is naive or outside ``ANCHOR_MIN``..``ANCHOR_MAX``.
    """
    try:
        return _schedule(expr, tz, anchor)
    except TypeError:  # unhashable arguments: say what is wrong with them
        _check_types(expr, tz, anchor)
        raise


def validate(expr: str) -> None:
    """Raise :class:`CronError` if ``expr`` is not a valid expression (zone-independent)."""
    _check_types(expr, "UTC", None)
    _spec(expr)


def next_fires(
    expr: str, after: datetime, n: int = 1, tz: str = "UTC", anchor: datetime | None = None
) -> list[datetime]:
    """The ``n`` first fire instants strictly after the aware ``after``, as aware UTC datetimes.

    Raises :class:`CronError` (a ``ValueError``) for an invalid expression, an unknown
    zone, or a naive ``after``/``anchor``.
    """
    return parse(expr, tz, anchor).next_fires(after, n)


def clear_caches() -> None:
    """Forget parsed expressions, schedules and zone tables (benchmarks and tests)."""
    _schedule.cache_clear()
    _compile.cache_clear()
    _spec.cache_clear()
    _zone.cache_clear()
