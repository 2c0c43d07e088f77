"""Brute-force reference of docs/cron.md §6 and §8.2, independent of the engine.

It walks local calendar days, keeps the matching ones (day rule), expands every
hh:mm of hours x minutes, and maps each nominal local time to its instants with
zoneinfo and PEP 495:

* fixed-hour: ``t.replace(tzinfo=zone, fold=0)`` (first pass in a fold, shifted by the
  gap size in a gap);
* wildcard-hour: each of fold=0/fold=1 that round-trips to ``t``.

The sets come from the test's own expression generator, never from the engine's parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo


@dataclass(frozen=True)
class Sets:
    """An expression as the oracle sees it: value sets plus the ``*``-prefix flags."""

    minutes: frozenset[int]
    hours: frozenset[int]
    doms: frozenset[int]
    months: frozenset[int]
    dows: frozenset[int]  # 0 = Sunday, 7 already folded
    dom_star: bool
    dow_star: bool
    hour_star: bool

    def day_matches(self, d: datetime) -> bool:
        if d.month not in self.months:
            return False
        in_dom = d.day in self.doms
        in_dow = (d.weekday() + 1) % 7 in self.dows
        if self.dom_star or self.dow_star:
            return in_dom and in_dow
        return in_dom or in_dow


def instants(sets: Sets, t: datetime, zone: ZoneInfo) -> set[datetime]:
    """The fire instants (UTC) of nominal local time ``t`` (naive)."""
    if not sets.hour_star:
        return {t.replace(tzinfo=zone, fold=0).astimezone(UTC)}
    out = set()
    for fold in (0, 1):
        u = t.replace(tzinfo=zone, fold=fold).astimezone(UTC)
        if u.astimezone(zone).replace(tzinfo=None) == t:
            out.add(u)
    return out


def fires_between(sets: Sets, zone: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    """All fire instants ``u`` with ``start < u <= end``, sorted, deduplicated on UTC."""
    # Two days of margin: a gap shift moves a nominal time by up to 24 h.
    first = start.astimezone(zone).replace(tzinfo=None).date() - timedelta(days=2)
    last = end.astimezone(zone).replace(tzinfo=None).date() + timedelta(days=2)
    times = sorted((h, m) for h in sets.hours for m in sets.minutes)
    found: set[datetime] = set()
    day = datetime(first.year, first.month, first.day)  # noqa: DTZ001 - local wall-clock
    while day.date() <= last:
        if sets.day_matches(day):
            for h, m in times:
                for u in instants(sets, day.replace(hour=h, minute=m), zone):
                    if start < u <= end:
                        found.add(u)
        day += timedelta(days=1)
    return sorted(found)
