"""Element semantics, macros, the Vixie day rule, the DST class, the search horizon and
``@every`` (docs/cron.md §4, §5, §6, §8.1, §9, §10): examples of each rule, one test each."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

import pytest

from periodic_manager.cron import CronSchedule, next_fires, parse


def sets(expr: str) -> CronSchedule:
    sched = parse(expr)
    assert isinstance(sched, CronSchedule)
    return sched


def fire_dates(expr: str, start: date, end: date, tz: str = "UTC") -> list[date]:
    """Dates of the fire instants in [start, end) (daily-or-rarer expressions)."""
    after = datetime(start.year, start.month, start.day, tzinfo=UTC) - timedelta(seconds=1)
    out = []
    for t in next_fires(expr, after, 400, tz=tz):
        if t.date() >= end:
            break
        out.append(t.date())
    return out


def days(start: date, end: date) -> list[date]:
    return [start + timedelta(days=i) for i in range((end - start).days)]


# --- §4 element semantics --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dow", "expected"),
    [
        ("*/2", (0, 2, 4, 6)),
        ("*/3", (0, 3, 6)),
        ("*/7", (0,)),
        ("1-7/2", (0, 1, 3, 5)),
        ("5-7", (0, 5, 6)),
        ("7", (0,)),
        ("mon-5", (1, 2, 3, 4, 5)),
        ("1-fri", (1, 2, 3, 4, 5)),
        ("sat,sun", (0, 6)),
        ("6-7", (0, 6)),
        ("1-7", tuple(range(7))),
    ],
)
def test_day_of_week_expansion_folds_seven_onto_sunday(dow: str, expected: tuple[int, ...]) -> None:
    assert sets(f"0 0 * * {dow}").spec.dows == expected


def test_day_of_month_steps_start_at_one() -> None:
    assert sets("0 0 */30 * *").spec.doms == (1, 31)
    assert sets("0 0 */10 * *").spec.doms == (1, 11, 21, 31)


def test_step_larger_than_span_keeps_the_first_value() -> None:
    assert sets("*/60 * * * *").spec.minutes == (0,)
    assert sets("0 0-23/25 * * *").spec.hours == (0,)


def test_minute_steps_do_not_wrap_across_the_hour() -> None:
    assert sets("*/25 * * * *").spec.minutes == (0, 25, 50)
    got = next_fires("*/25 * * * *", datetime(2024, 1, 1, 0, 40, tzinfo=UTC), 2)
    assert got == [datetime(2024, 1, 1, 0, 50, tzinfo=UTC), datetime(2024, 1, 1, 1, 0, tzinfo=UTC)]


def test_range_step_and_single_range() -> None:
    assert sets("50-59/3 * * * *").spec.minutes == (50, 53, 56, 59)
    assert sets("5-5 * * * *").spec.minutes == (5,)
    assert sets("0 0 * jan-jun/2 *").spec.months == (1, 3, 5)


def test_lists_are_unions_and_stars_may_appear_in_lists() -> None:
    assert sets("*,30 * * * *").spec.minutes == tuple(range(60))
    assert sets("1,*,1 * * * *").spec.minutes == tuple(range(60))
    assert sets("5,1,5 * * * *").spec.minutes == (1, 5)


def test_leading_zeros_and_case_insensitive_names() -> None:
    assert sets("00 09 * * *").spec.hours == (9,)
    assert sets("007 * * * *").spec.minutes == (7,)
    assert sets("0 0 * JAN,Feb mOn").spec.months == (1, 2)


# --- §5 macros ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("macro", "expansion"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_macro_evaluates_as_its_expansion(macro: str, expansion: str) -> None:
    a, b = sets(macro).spec, sets(expansion).spec
    fields = ("minutes", "hours", "doms", "months", "dows", "dom_star", "dow_star", "hour_star")
    assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
    after = datetime(2024, 2, 27, 13, 17, tzinfo=UTC)
    for tz in ("UTC", "Europe/Berlin"):
        assert next_fires(macro, after, 5, tz) == next_fires(expansion, after, 5, tz)


def test_weekly_fires_on_sundays() -> None:
    got = next_fires("@weekly", datetime(2024, 1, 1, tzinfo=UTC), 3)
    assert [d.date() for d in got] == [date(2024, 1, 7), date(2024, 1, 14), date(2024, 1, 21)]


# --- §6 the Vixie day rule -------------------------------------------------------------------

SEP, DEC = date(2024, 9, 1), date(2024, 12, 1)


def test_restricted_dom_and_dow_is_or_first_and_every_monday() -> None:
    want = [d for d in days(SEP, DEC) if d.day == 1 or d.weekday() == 0]
    assert fire_dates("0 0 1 * 1", SEP, DEC) == want


def test_friday_13_means_every_13th_and_every_friday() -> None:
    want = [d for d in days(SEP, DEC) if d.day == 13 or d.weekday() == 4]
    assert fire_dates("0 0 13 * 5", SEP, DEC) == want


def test_days_1_to_7_and_monday_is_not_first_monday() -> None:
    want = [d for d in days(SEP, DEC) if d.day <= 7 or d.weekday() == 0]
    assert fire_dates("0 0 1-7 * 1", SEP, DEC) == want


def test_star_step_dow_is_unrestricted_so_first_sunday_of_month() -> None:
    want = [d for d in days(SEP, DEC) if d.day <= 7 and d.weekday() == 6]
    assert fire_dates("0 0 1-7 * */7", SEP, DEC) == want


def test_star_step_dom_is_unrestricted_so_odd_days_that_are_mondays() -> None:
    want = [d for d in days(SEP, DEC) if d.day % 2 == 1 and d.weekday() == 0]
    assert fire_dates("0 0 */2 * 1", SEP, DEC) == want


def test_first_of_month_when_sun_tue_thu_sat() -> None:
    start, end = date(2024, 1, 1), date(2026, 1, 1)
    want = [d for d in days(start, end) if d.day == 1 and d.weekday() in (6, 1, 3, 5)]
    assert fire_dates("0 0 1 * */2", start, end) == want


def test_full_ranges_without_star_are_restricted_so_every_day() -> None:
    assert fire_dates("0 0 1-31 * 1", SEP, DEC) == days(SEP, DEC)
    assert fire_dates("0 0 1 * 0-6", SEP, DEC) == days(SEP, DEC)


def test_star_first_in_list_decides_the_rule() -> None:
    assert fire_dates("0 0 1 * *,1", SEP, DEC) == [d for d in days(SEP, DEC) if d.day == 1]
    assert fire_dates("0 0 1 * 1,*", SEP, DEC) == days(SEP, DEC)


def test_feb_29_or_monday_fires_every_year() -> None:
    start, end = date(2025, 1, 1), date(2027, 1, 1)
    want = [d for d in days(start, end) if d.month == 2 and d.weekday() == 0]
    assert fire_dates("0 0 29 2 1", start, end) == want


def test_feb_31_or_monday_is_every_monday_in_february() -> None:
    start, end = date(2024, 1, 1), date(2025, 12, 31)
    want = [d for d in days(start, end) if d.month == 2 and d.weekday() == 0]
    assert fire_dates("0 0 31 2 1", start, end) == want


# --- §8.1 DST class ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    [
        "30 2 * * *",
        "0 1-3 * * *",
        "30 1,2,3 * * *",
        "0 0-23/2 * * *",
        "* 2 * * *",
        "*/15 2 * * *",
        "@daily",
    ],
)
def test_hour_field_not_starting_with_star_is_fixed_hour(expr: str) -> None:
    assert sets(expr).spec.fixed_hour


@pytest.mark.parametrize(
    "expr", ["0 * * * *", "@hourly", "0 */2 * * *", "30 */6 * * *", "*/30 * * * *", "0 *,5 * * *"]
)
def test_hour_field_starting_with_star_is_wildcard_hour(expr: str) -> None:
    assert not sets(expr).spec.fixed_hour


# --- §9 no search horizon ------------------------------------------------------------------


def feb29_sundays(first: int, last: int) -> list[int]:
    return [y for y in range(first, last) if _leap(y) and date(y, 2, 29).weekday() == 6]


def _leap(y: int) -> bool:
    return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)


def test_feb_29_on_sunday_is_found_forty_years_away() -> None:
    got = next_fires("0 0 29 2 */7", datetime(2024, 3, 1, tzinfo=UTC), 4)
    assert [t.year for t in got] == [2032, 2060, 2088, 2128]
    assert all(t == datetime(t.year, 2, 29, tzinfo=UTC) for t in got)


@pytest.mark.parametrize("tz", ["UTC", "Europe/Berlin", "Pacific/Chatham", "America/Sao_Paulo"])
def test_far_future_searches_from_year_2999(tz: str) -> None:
    got = next_fires("0 0 29 2 */7", datetime(2999, 1, 1, tzinfo=UTC), 3, tz=tz)
    assert [t.year for t in got] == feb29_sundays(2999, 3200)[:3]


def test_search_into_2104_skips_the_non_leap_century() -> None:
    got = next_fires("0 0 29 2 *", datetime(2097, 3, 1, tzinfo=UTC), 1)
    assert got == [datetime(2104, 2, 29, tzinfo=UTC)]
    got = next_fires("0 12 29 2 *", datetime(2397, 1, 1, tzinfo=UTC), 1, tz="Europe/Berlin")
    assert got == [datetime(2400, 2, 29, 11, tzinfo=UTC)]


def test_far_future_dst_rule_still_applies() -> None:
    # The tzdata POSIX rule keeps Berlin's last-Sunday-of-March gap in 2999.
    got = next_fires("30 2 * * *", datetime(2999, 3, 30, 12, tzinfo=UTC), 2, tz="Europe/Berlin")
    assert got == [
        datetime(2999, 3, 31, 1, 30, tzinfo=UTC),
        datetime(2999, 4, 1, 0, 30, tzinfo=UTC),
    ]


def test_year_9999_is_reachable_and_beyond_it_is_an_overflow() -> None:
    assert next_fires("0 0 31 12 *", datetime(9999, 6, 1, tzinfo=UTC)) == [
        datetime(9999, 12, 31, tzinfo=UTC)
    ]
    assert next_fires(
        "59 23 31 12 *", datetime(9999, 12, 30, tzinfo=UTC), tz="Pacific/Kiritimati"
    ) == [datetime(9999, 12, 31, 9, 59, tzinfo=UTC)]
    with pytest.raises(OverflowError):
        next_fires("0 0 1 1 *", datetime(9999, 6, 1, tzinfo=UTC))


# --- §10 @every ----------------------------------------------------------------------------


def test_every_is_anchored_to_the_unix_epoch_by_default() -> None:
    after = datetime(2024, 1, 1, 0, 30, tzinfo=UTC)
    assert next_fires("@every 1h", after, 2) == [
        datetime(2024, 1, 1, 1, tzinfo=UTC),
        datetime(2024, 1, 1, 2, tzinfo=UTC),
    ]
    assert next_fires("@every 1d", after) == [datetime(2024, 1, 2, tzinfo=UTC)]
    # 7 min does not divide an hour: the grid is k * 420 s since 1970.
    got = next_fires("@every 7m", after)[0]
    assert (got - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() % 420 == 0


def test_every_ignores_the_zone_and_dst() -> None:
    after = datetime(2024, 3, 30, 23, 30, tzinfo=UTC)
    got = next_fires("@every 1h", after, 4, tz="Europe/Berlin")
    assert [b - a for a, b in zip(got, got[1:], strict=False)] == [timedelta(hours=1)] * 3
    assert next_fires("@every 1h", after, 1, tz="Asia/Kathmandu") == [
        datetime(2024, 3, 31, tzinfo=UTC)
    ]


def test_every_is_strictly_after_a_grid_point() -> None:
    grid = datetime(2024, 1, 1, 1, tzinfo=UTC)
    assert next_fires("@every 1h", grid) == [datetime(2024, 1, 1, 2, tzinfo=UTC)]
    assert next_fires("@every 1h", grid - timedelta(microseconds=1)) == [grid]


def test_every_with_anchor_after_the_start_and_sub_second_precision() -> None:
    anchor = datetime(2030, 1, 1, 0, 0, 0, 250_000, tzinfo=UTC)
    after = datetime(2024, 1, 1, tzinfo=UTC)
    got = next_fires("@every 1h30m", after, 2, anchor=anchor)
    assert all((anchor - t) % timedelta(minutes=90) == timedelta(0) for t in got)
    assert got[0] > after and got[0] - after <= timedelta(minutes=90)
    assert got[0].microsecond == 250_000


def test_every_anchor_is_an_instant_whatever_its_offset() -> None:
    a1 = datetime(2024, 1, 1, 1, 10, tzinfo=timezone(timedelta(hours=1)))
    a2 = datetime(2024, 1, 1, 0, 10, tzinfo=UTC)
    after = datetime(2024, 1, 2, tzinfo=UTC)
    assert parse("@every 25m", anchor=a1) is parse("@every 25m", anchor=a2)
    assert next_fires("@every 25m", after, anchor=a1) == next_fires("@every 25m", after, anchor=a2)
