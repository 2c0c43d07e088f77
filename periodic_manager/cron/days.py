"""Zone-free wall-clock matching: the next matching local minute after a local time.

Local wall-clock times are plain integers: seconds since local 1970-01-01 00:00 (no
zone, no DST). ``DayTable.next_local(x)`` answers "the smallest nominal fire time
``t > x``" in a handful of integer operations: the matching days of a month are one
bitmask (the day rule of §6 applied with AND/OR on bitmasks), the times of a matching
day are one sorted list searched with ``bisect``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from typing import TypeVar

from periodic_manager.cron.parser import CronSpec

DAY_S = 86_400
_MONTH_LEN = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
# Months are scanned up to here; a nominal time in year 10000 can still be a
# representable UTC instant in a zone east of Greenwich, so stop one year later.
_LAST_YEAR = 10_000
_MONTH_CACHE_MAX = 4096


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of the proleptic Gregorian date (y, m, d)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def civil_from_days(z: int) -> tuple[int, int, int]:
    """Inverse of :func:`days_from_civil`."""
    z += 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (m <= 2), m, d


def month_length(y: int, m: int) -> int:
    """Days in month ``m`` of year ``y`` (Gregorian leap rule)."""
    if m == 2 and y % 4 == 0 and (y % 100 != 0 or y % 400 == 0):
        return 29
    return _MONTH_LEN[m]


# Tables that depend on one field only, shared by every expression with the same field (a
# million schedules have few distinct day fields; each table is a few hundred bytes).
_DOW_TABLES: dict[tuple[int, ...], tuple[int, ...]] = {}
_MONTH_TABLES: dict[tuple[int, ...], tuple[tuple[bool, ...], tuple[tuple[int, int], ...]]] = {}
_SHARED_MAX = 4096
_T = TypeVar("_T")


def _shared(
    cache: dict[tuple[int, ...], _T], key: tuple[int, ...], make: Callable[[tuple[int, ...]], _T]
) -> _T:
    got = cache.get(key)
    if got is None:
        if len(cache) >= _SHARED_MAX:
            cache.clear()
        got = cache[key] = make(key)
    return got


def _dow_table(dows: tuple[int, ...]) -> tuple[int, ...]:
    """[w]: the days of a 31-day month whose day 1 falls on weekday w (0 = Sunday), as bits:
    one week's pattern repeated five times."""
    out = []
    for w in range(7):
        week = sum(1 << i for i in range(7) if (w + i) % 7 in dows)
        out.append((week * 0b1_0000001_0000001_0000001_0000001) & 0x7FFF_FFFF)
    return tuple(out)


def _month_tables(months: tuple[int, ...]) -> tuple[tuple[bool, ...], tuple[tuple[int, int], ...]]:
    """(selected[m] for m in 0..12, successor[m]): the next selected month after m, and 1 if
    that is in the next year."""
    succ = [(0, 0)]
    for m in range(1, 13):
        later = [k for k in months if k > m]
        succ.append((later[0], 0) if later else (months[0], 1))
    return tuple(m in months for m in range(13)), tuple(succ)


class DayTable:
    """Precomputed matching tables of one expression; shared by all zones using it."""

    __slots__ = (
        "times",
        "first",
        "_n",
        "_dom",
        "_dow",
        "_and",
        "_month_ok",
        "_succ",
        "_slot",
        "_months",
    )

    def __init__(self, spec: CronSpec) -> None:
        self.times = sorted(h * 3600 + m * 60 for h in spec.hours for m in spec.minutes)
        self.first = self.times[0]
        self._n = len(self.times)
        # Bit d-1 stands for day d of a month.
        self._dom = sum(1 << (d - 1) for d in spec.doms)
        self._dow = _shared(_DOW_TABLES, spec.dows, _dow_table)  # see _dow_table
        self._and = spec.day_and
        self._month_ok, self._succ = _shared(_MONTH_TABLES, spec.months, _month_tables)
        # The month of the last answer: (first day, first day of next month, mask, y, m).
        # Successive calls of one schedule nearly always land in it.
        self._slot = (0, 0, 0, 1970, 1)
        self._months: dict[int, tuple[int, int]] = {}

    def month_mask(self, y: int, m: int) -> tuple[int, int]:
        """(first day number, bitmask of matching days) of month (y, m)."""
        key = y * 12 + m
        got = self._months.get(key)
        if got is not None:
            return got
        first = days_from_civil(y, m, 1)
        if not self._month_ok[m]:
            mask = 0
        else:
            dow = self._dow[(first + 4) % 7]  # 1970-01-01 was a Thursday (4)
            mask = (self._dom & dow) if self._and else (self._dom | dow)
            mask &= (1 << month_length(y, m)) - 1
        if len(self._months) >= _MONTH_CACHE_MAX:
            self._months.clear()
        self._months[key] = got = (first, mask)
        return got

    def _load(self, day: int) -> tuple[int, int, int, int, int]:
        y, m, _ = civil_from_days(day)
        first, mask = self.month_mask(y, m)
        slot = (first, first + month_length(y, m), mask, y, m)
        self._slot = slot
        return slot

    def next_local(self, x: int) -> int:
        """The smallest matching nominal local time ``t > x`` (local seconds)."""
        day, sod = divmod(x, DAY_S)
        slot = self._slot
        if not slot[0] <= day < slot[1]:
            slot = self._load(day)
        lo, _, mask, y, m = slot
        bit = day - lo
        if (mask >> bit) & 1:
            i = bisect_right(self.times, sod)
            if i < self._n:
                return day * DAY_S + self.times[i]
        rest = mask >> (bit + 1)
        if rest:
            return (day + (rest & -rest).bit_length()) * DAY_S + self.first
        return self._next_month(y, m)

    def _next_month(self, y: int, m: int) -> int:
        """First fire time of the first matching day in a month after (y, m)."""
        succ = self._succ
        while True:
            m, carry = succ[m]
            y += carry
            if y > _LAST_YEAR:
                raise OverflowError("no fire time before year 10000")
            first, mask = self.month_mask(y, m)
            if mask:
                self._slot = (first, first + month_length(y, m), mask, y, m)
                return (first + (mask & -mask).bit_length() - 1) * DAY_S + self.first
