"""Property tests: the engine against the brute-force oracle (tests/cron/oracle.py).

Random valid expressions (generated together with their value sets, so the oracle never
uses the engine's parser), random zones and start instants close to real transitions of
those zones. Both sides must produce exactly the same fire instants in a window after the
start. Set CRON_HYPOTHESIS_EXAMPLES to run more examples (default kept small for CI).
"""

from __future__ import annotations

import os
import zoneinfo
import zoneinfo._zoneinfo as pure_zoneinfo  # test-only: the pure-Python class lists transitions
from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from periodic_manager.cron import parse

from .oracle import Sets, fires_between

EXAMPLES = int(os.environ.get("CRON_HYPOTHESIS_EXAMPLES", "60"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

ZONES = [
    "Europe/Berlin",
    "America/New_York",
    "America/Sao_Paulo",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "Asia/Kathmandu",
    "Antarctica/Troll",
    "Pacific/Apia",
    "Africa/Monrovia",
    "Europe/Dublin",
    "America/St_Johns",
    "America/Juneau",
    "Asia/Manila",
    "UTC",
]
MONTHS = "jan feb mar apr may jun jul aug sep oct nov dec".split()
DOWS = "sun mon tue wed thu fri sat".split()
MAX_LEN = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# --- expressions, generated with their meaning -------------------------------------------


@st.composite
def element(
    draw: st.DrawFn, lo: int, hi: int, values: st.SearchStrategy[int], names: list[str] | None
) -> tuple[str, set[int]]:
    def show(v: int) -> str:
        if names is not None and v - lo < len(names) and draw(st.booleans()):
            return names[v - lo]
        return str(v)

    kind = draw(st.sampled_from(["star", "step", "value", "value", "range", "range-step"]))
    if kind == "star":
        return "*", set(range(lo, hi + 1))
    if kind == "step":
        n = draw(st.integers(1, hi - lo + 2))
        return f"*/{n}", set(range(lo, hi + 1, n))
    a = draw(values)
    if kind == "value":
        return show(a), {a}
    b = draw(st.integers(a, hi))
    if kind == "range":
        return f"{show(a)}-{show(b)}", set(range(a, b + 1))
    n = draw(st.integers(1, hi - lo + 1))
    return f"{show(a)}-{show(b)}/{n}", set(range(a, b + 1, n))


@st.composite
def field(
    draw: st.DrawFn,
    lo: int,
    hi: int,
    values: st.SearchStrategy[int],
    names: list[str] | None = None,
    star_weight: int = 0,
) -> tuple[str, set[int]]:
    if star_weight and draw(st.integers(0, 9)) < star_weight:
        return "*", set(range(lo, hi + 1))
    parts = draw(st.lists(element(lo, hi, values, names), min_size=1, max_size=3))
    return ",".join(p for p, _ in parts), set().union(*(s for _, s in parts))


# Hours and minutes near typical transition times make DST cases frequent.
HOURS = st.one_of(st.sampled_from([0, 1, 2, 3, 4, 22, 23]), st.integers(0, 23))
MINUTES = st.one_of(st.sampled_from([0, 10, 15, 20, 30, 40, 45, 50]), st.integers(0, 59))


@st.composite
def expressions(draw: st.DrawFn) -> tuple[str, Sets]:
    minute, mins = draw(field(0, 59, MINUTES))
    hour, hours = draw(field(0, 23, HOURS, star_weight=3))
    dom, doms = draw(field(1, 31, st.integers(1, 31), star_weight=7))
    month, months = draw(field(1, 12, st.integers(1, 12), MONTHS, star_weight=8))
    dow, dows = draw(field(0, 7, st.integers(0, 7), DOWS, star_weight=6))
    sets = Sets(
        frozenset(mins),
        frozenset(hours),
        frozenset(doms),
        frozenset(months),
        frozenset(d % 7 for d in dows),
        dom.startswith("*"),
        dow.startswith("*"),
        hour.startswith("*"),
    )
    # Keep only expressions that can fire (the never-fires rule has its own tests).
    assume(
        not (sets.dom_star or sets.dow_star) or any(d <= MAX_LEN[m] for m in months for d in doms)
    )
    sep = draw(st.sampled_from([" ", "  ", "\t"]))
    return sep.join([minute, hour, dom, month, dow]), sets


# --- start instants near transitions -----------------------------------------------------


@cache
def transitions(zone: str) -> list[int]:
    """UTC instants where the zone's offset changes, 1850-2037 from tzdata, plus 2040-2041."""
    z = pure_zoneinfo.ZoneInfo.no_cache(zone)
    out = []
    offs = [z._tti_before.utcoff if z._tti_before else None] + [t.utcoff for t in z._ttinfos]  # type: ignore[attr-defined]
    for i, t in enumerate(z._trans_utc):  # type: ignore[attr-defined]
        if offs[i + 1] != offs[i] and -3_786_825_600 < t:
            out.append(t)
    info = ZoneInfo(zone)
    prev = None
    for hour in range(0, 2 * 365 * 24, 6):
        when = datetime(2040, 1, 1, tzinfo=UTC) + timedelta(hours=hour)
        off = when.astimezone(info).utcoffset()
        if prev is not None and off != prev:
            out.append(int((when - EPOCH).total_seconds()))
        prev = off
    return out or [0]


@st.composite
def starts(draw: st.DrawFn, zones: list[str]) -> tuple[str, datetime]:
    zone = draw(st.sampled_from(zones))
    trans = draw(st.sampled_from(transitions(zone)))
    delta = draw(st.integers(-3 * 86_400, 2 * 86_400))
    if draw(st.booleans()):
        delta -= delta % 60  # often exactly on a minute, i.e. possibly on a fire instant
    micro = draw(st.sampled_from([0, 0, 0, 1, 999_999]))
    return zone, EPOCH + timedelta(seconds=trans + delta, microseconds=micro)


def engine_fires(expr: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    sched = parse(expr, tz=zone)
    out, t = [], start
    while True:
        t = sched.next_after(t)
        if t > end:
            return out
        assert t.tzinfo is UTC
        out.append(t)


WINDOW = timedelta(days=3)


@SETTINGS
@given(expressions(), starts(ZONES))
def test_engine_matches_oracle_near_transitions(
    expr_sets: tuple[str, Sets], start: tuple[str, datetime]
) -> None:
    expr, sets = expr_sets
    zone, after = start
    end = after + WINDOW
    assert engine_fires(expr, zone, after, end) == fires_between(sets, ZoneInfo(zone), after, end)


# "localtime" (listed where the system's zone data has that file) is the host's zone, which
# the engine refuses on purpose (test_cron_validation).
IANA_ZONES = sorted(zoneinfo.available_timezones() - {"localtime"})


@SETTINGS
@given(expressions(), starts(IANA_ZONES))
def test_engine_matches_oracle_in_any_zone(
    expr_sets: tuple[str, Sets], start: tuple[str, datetime]
) -> None:
    expr, sets = expr_sets
    zone, after = start
    end = after + WINDOW
    assert engine_fires(expr, zone, after, end) == fires_between(sets, ZoneInfo(zone), after, end)


@SETTINGS
@given(expressions(), starts(ZONES), st.integers(1, 6))
def test_next_fires_is_the_suffix_of_one_set(
    expr_sets: tuple[str, Sets], start: tuple[str, datetime], n: int
) -> None:
    """Asking from any instant between two slots gives the same continuation (no hidden state)."""
    expr, _ = expr_sets
    zone, after = start
    sched = parse(expr, tz=zone)
    got = sched.next_fires(after, n)
    assert got == sorted(set(got)) and got[0] > after
    for a, b in zip(got, got[1:], strict=False):
        middle = a + (b - a) / 2
        assert sched.next_after(middle) == b
        assert sched.next_after(a) == b


@settings(max_examples=max(10, EXAMPLES // 4), deadline=None)
@given(
    st.sampled_from(
        [
            "0 0 29 2 */7",
            "0 12 29 2 mon",
            "30 1 29 2 */7",
            "0 0 1 1 *",
            "0 2 * 3 0",
            "30 */23 16 2 *",
            "*/20 */2 29 2 */7",
            "45 2 31 3 *",
        ]
    ),
    st.sampled_from(
        ["UTC", "Europe/Berlin", "Pacific/Chatham", "America/Sao_Paulo", "Australia/Lord_Howe"]
    ),
    st.integers(1971, 9800),
)
def test_far_future_matches_a_day_by_day_oracle(expr: str, zone: str, year: int) -> None:
    """No search horizon: compare with a day walk over the years ahead."""
    sched = parse(expr, tz=zone)
    after = datetime(year, 3, 1, tzinfo=UTC)
    got = sched.next_after(after)
    spec = sched.spec  # type: ignore[attr-defined]
    sets = Sets(
        frozenset(spec.minutes),
        frozenset(spec.hours),
        frozenset(spec.doms),
        frozenset(spec.months),
        frozenset(spec.dows),
        spec.dom_star,
        spec.dow_star,
        spec.hour_star,
    )
    info = ZoneInfo(zone)
    # Walk local dates from just before `after`; at the first matching date with a fire
    # instant after `after`, the oracle maps a window around it exactly.
    day = after.astimezone(info).replace(tzinfo=None, hour=0, minute=0) - timedelta(days=2)
    while True:
        if sets.day_matches(day):
            want = fires_between(sets, info, after, day.replace(tzinfo=UTC) + timedelta(days=3))
            if want:
                break
        day += timedelta(days=1)
    assert got == want[0]
