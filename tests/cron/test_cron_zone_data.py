"""The installed tz data satisfies what zones.py assumes (see its module docstring).

zones.py finds transitions by probing the UTC offset every PROBE_S seconds. That is exact
when two offset changes are never closer than PROBE_S, and the span logic of schedule.py
needs every gap or fold to be shorter than LOOKBACK_S and than the span before the next
change. A tzdata update that broke this would fail here, not silently in production.
The pure-Python zoneinfo class is used because it exposes the transition table.
"""

from __future__ import annotations

import zoneinfo
import zoneinfo._zoneinfo as pure_zoneinfo  # test-only: exposes the transition table

from periodic_manager.cron.zones import LOOKBACK_S, PROBE_S


def offset_changes(name: str) -> list[tuple[int, int, int]]:
    """(instant, offset before, offset after) of every offset change, tables and rule."""
    z = pure_zoneinfo.ZoneInfo.no_cache(name)
    before = z._tti_before.utcoff if z._tti_before else None  # type: ignore[attr-defined]
    offs = [before] + [t.utcoff for t in z._ttinfos]  # type: ignore[attr-defined]
    out = []
    for i, t in enumerate(z._trans_utc):  # type: ignore[attr-defined]
        if offs[i] is not None and offs[i + 1] != offs[i]:
            out.append((t, int(offs[i].total_seconds()), int(offs[i + 1].total_seconds())))
    rule = z._tz_after  # type: ignore[attr-defined]
    if hasattr(rule, "transitions") and rule.dst_diff:
        std = int(rule.std.utcoff.total_seconds())
        dst = int(rule.dst.utcoff.total_seconds())
        last = out[-1][0] if out else -(2**62)
        for year in (2037, 2038, 2039, 2040, 2300, 2301, 9998, 9999):
            start, end = rule.transitions(year)  # local standard/daylight epoch seconds
            for when, old, new in ((start - std, std, dst), (end - dst, dst, std)):
                if when > last:
                    out.append((when, old, new))
        out.sort()
    return out


def test_probe_step_and_lookback_cover_every_zone() -> None:
    worst_spacing = (PROBE_S * 100, "")
    for name in sorted(zoneinfo.available_timezones()):
        changes = offset_changes(name)
        for when, old, new in changes:
            assert abs(new - old) < LOOKBACK_S, (name, when, old, new)
        for (t1, *_), (t2, old, new) in zip(changes, changes[1:], strict=False):
            spacing = t2 - t1
            if spacing < 100 * 365 * 86_400:  # not the jump between two sampled rule years
                worst_spacing = min(worst_spacing, (spacing, name))
                assert spacing > PROBE_S, (name, t1, t2)
                assert spacing > abs(new - old) + LOOKBACK_S, (name, t1, t2)
    assert worst_spacing[0] > PROBE_S
