"""Schedules: a parsed expression bound to a zone (or an ``@every`` grid), evaluated on instants.

The fire set of a cron schedule (docs/cron.md §8.2) is assembled span by span,
where a span is a stretch of UTC time with one offset ``off`` that began at a transition
``lo`` from offset ``prev``:

* **A-runs**: nominal local times ``t`` shown in the span fire at ``t - off`` — except,
  for a fixed-hour schedule after a fold (``prev > off``), the local times
  ``[lo + off, lo + prev)`` that the first pass already showed;
* **B-runs** (fixed-hour only, after a gap, ``off > prev``): nominal times in the gap
  ``[lo + prev, lo + off)`` fire shifted by the gap size, at ``t - prev`` (PEP 495 fold=0).

Every fire instant in a span is ``>= lo``, so the first span holding a candidate
decides; a gap's B-runs may come after A-runs with a later nominal time, hence the
minimum over both. Away from transitions this is one ``next_local`` call: the fast path.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_right
from datetime import UTC, datetime, timedelta

from periodic_manager.cron.days import DAY_S, DayTable
from periodic_manager.cron.errors import NaiveDatetimeError
from periodic_manager.cron.parser import CronSpec, EverySpec
from periodic_manager.cron.zones import Zone

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_NEVER = 10**18
# Skipping spans in a long search. No local time in (s0 + off0, first_t) matches, where
# first_t is the first lookup. An instant x >= s0 + _SETTLE_S shows a local time above
# s0 + off0, and an instant x < first_t - off - _SKIP_S shows one below first_t (and so do
# the gaps and folds of transitions there), because offsets differ by less than 48 h. So
# such instants fire nothing and the search may jump over them.
_SETTLE_S = 2 * DAY_S
_SKIP_S = 3 * DAY_S


def _naive(field: str) -> NaiveDatetimeError:
    return NaiveDatetimeError(
        field, "naive-datetime", "must be timezone-aware (an instant), got a naive datetime"
    )


def _not_instant(after: object) -> TypeError:
    return TypeError(f"after must be an aware datetime, not {type(after).__name__}")


def _bad_after(after: object) -> TypeError:
    """``after`` without a usable offset: a naive datetime, or no datetime at all."""
    return _naive("after") if isinstance(after, datetime) else _not_instant(after)


def _since(after: datetime) -> timedelta:
    """``after - EPOCH``; TypeError unless ``after`` is an aware datetime (the one check of
    every ``next_after``)."""
    try:
        tzinfo = after.tzinfo
    except AttributeError:  # not a datetime: a date, a string, a number
        raise _not_instant(after) from None
    if tzinfo is not UTC and (tzinfo is None or after.utcoffset() is None):
        raise _bad_after(after)
    try:
        return after - EPOCH
    except TypeError:  # an aware time of day
        raise _not_instant(after) from None


def _seconds(after: datetime) -> int:
    """Whole seconds since the epoch, floored. Fire instants are whole seconds, so
    ``u > after`` iff ``u > floor(after)``."""
    d = _since(after)
    return d.days * 86_400 + d.seconds


def _instant(u: int) -> datetime:
    try:
        return EPOCH + timedelta(0, u)
    except OverflowError:
        raise OverflowError("no fire time before year 10000") from None


class Schedule(ABC):
    """A schedule: ``expr`` in zone ``tz``; answers "the next fire instants after"."""

    __slots__ = ("expr", "tz")

    def __init__(self, expr: str, tz: str) -> None:
        self.expr = expr
        self.tz = tz

    @abstractmethod
    def next_after(self, after: datetime) -> datetime:
        """The first fire instant strictly after the aware ``after``, as an aware UTC datetime."""

    def next_fires(self, after: datetime, n: int = 1) -> list[datetime]:
        """The ``n`` first fire instants strictly after ``after`` (aware UTC datetimes)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        out = []
        for _ in range(n):
            after = self.next_after(after)
            out.append(after)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.expr!r}, tz={self.tz!r})"


class CronSchedule(Schedule):
    """A five-field expression (or macro) in an IANA zone."""

    __slots__ = ("spec", "zone", "_table", "_fixed", "_times", "_n", "_fast", "_last")

    def __init__(self, spec: CronSpec, table: DayTable, zone: Zone) -> None:
        super().__init__(spec.text, zone.name)
        self.spec = spec
        self.zone = zone
        self._table = table
        self._fixed = spec.fixed_hour
        self._times = table.times
        self._n = len(table.times)
        # Fast-path memo (clean, hi, off, day0): for an instant s >= clean whose local
        # time s + off falls on the matching local day starting at day0, the answer is
        # the next time of that day, provided it is before hi. Set by next_second.
        self._fast = (_NEVER, 0, 0, 0)
        # The last slow-path answer: at startup every entry sharing this schedule asks
        # for the slot after the same "now".
        self._last: tuple[int, datetime] = (_NEVER, EPOCH)  # (second asked, its answer)

    def next_after(self, after: datetime) -> datetime:
        # The hot path of the scheduler: _seconds() inlined, then the memo of the last day.
        d = _since(after)
        s = d.days * 86_400 + d.seconds
        clean, hi, off, day0 = self._fast
        if s >= clean:
            sod = s + off - day0
            if 0 <= sod < DAY_S:
                i = bisect_right(self._times, sod)
                if i < self._n:
                    u = day0 + self._times[i] - off
                    if u < hi:
                        return EPOCH + timedelta(0, u)
        last = self._last
        if last[0] == s:
            return last[1]
        result = _instant(self.next_second(s))
        self._last = (s, result)
        return result

    def next_fires(self, after: datetime, n: int = 1) -> list[datetime]:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        s = _seconds(after)
        out = []
        for _ in range(n):
            s = self.next_second(s)
            out.append(_instant(s))
        return out

    def next_second(self, s: int) -> int:
        """The smallest fire instant ``u > s`` (integer seconds since the epoch)."""
        span = self.zone.span
        next_local = self._table.next_local
        fixed = self._fixed
        pending: int | None = None  # a B-run found beyond its span's verified end
        # Memo of the last lookup: no match in (memo_from, memo_t), so any start in
        # [memo_from, memo_t) gives memo_t. Long searches cross many spans with one lookup.
        memo_from = memo_t = 0
        # Skipping ahead (see _skip_to) needs the first lookup, made from s + off unadjusted.
        first_t: int | None = None
        s0 = s
        while True:
            _, lo, hi, off, prev, clean = span(s + 1)
            start = s + off
            adjusted = fixed and prev > off and start < lo + prev - 1
            if adjusted:
                # Fold at lo: [lo+off, lo+prev) is the second pass, already fired.
                start = lo + prev - 1
            best = pending
            if not memo_from <= start < memo_t:
                memo_t = next_local(start)
                memo_from = start
            t = memo_t
            if s == s0 and not adjusted:
                first_t = t
            if t - off < hi and (best is None or t - off < best):
                best = t - off
                self._fast = (clean, hi, off, t - t % DAY_S)
            if fixed and off > prev and s + prev < lo + off - 1:
                # Gap at lo: nominal times in [lo+prev, lo+off) fire read with the old offset.
                start = max(s + prev, lo + prev - 1)
                if not memo_from <= start < memo_t:
                    memo_t = next_local(start)
                    memo_from = start
                if memo_t < lo + off and (best is None or memo_t - prev < best):
                    best = memo_t - prev
            if best is not None and best < hi:
                return best
            pending = best
            s = hi - 1
            if pending is None and first_t is not None and s >= s0 + _SETTLE_S:
                s = max(s, first_t - off - _SKIP_S)


class EverySchedule(Schedule):
    """``@every <duration>``: instants ``anchor + k * period`` (§10); zone-independent."""

    __slots__ = ("spec", "anchor", "_anchor_us", "_period_us")

    def __init__(self, spec: EverySpec, tz: str, anchor: datetime | None) -> None:
        super().__init__(spec.text, tz)
        if anchor is not None and (anchor.tzinfo is None or anchor.utcoffset() is None):
            raise _naive("anchor")
        self.spec = spec
        self.anchor = anchor.astimezone(UTC) if anchor is not None else EPOCH
        self._anchor_us = (self.anchor - EPOCH) // _US
        self._period_us = spec.period_us

    def next_after(self, after: datetime) -> datetime:
        a = _since(after) // _US
        k = (a - self._anchor_us) // self._period_us + 1
        try:
            return EPOCH + timedelta(microseconds=self._anchor_us + k * self._period_us)
        except OverflowError:
            raise OverflowError("no fire time before year 10000") from None
