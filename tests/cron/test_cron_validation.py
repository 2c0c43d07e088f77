"""Validation (docs/cron.md §2, §7, §10): one test per rejection reason, many examples of
each, the field each error names, and the accepted edge forms."""

from __future__ import annotations

import time
from datetime import UTC, date, datetime, timedelta, timezone
from datetime import time as time_of_day

import pytest

from periodic_manager.cron import (
    ANCHOR_MAX,
    ANCHOR_MIN,
    CronError,
    clear_caches,
    next_fires,
    parse,
    validate,
)
from periodic_manager.cron.errors import CODES
from periodic_manager.errors import ConfigError


def rejected(expr: str) -> CronError:
    with pytest.raises(CronError) as info:
        validate(expr)
    return info.value


def check(expr: str, code: str, field: str) -> None:
    err = rejected(expr)
    assert (err.code, err.field) == (code, field), str(err)
    assert str(err).startswith(f"{field}: {code}: "), str(err)
    assert err.reason.startswith(f"{code}: ")


@pytest.mark.parametrize(
    ("expr", "field"),
    [
        ("a b c d e", "minute"),
        ("*/ * * * *", "minute"),
        ("/5 * * * *", "minute"),
        ("*-5 * * * *", "minute"),
        ("5-* * * * *", "minute"),
        ("1-2-3 * * * *", "minute"),
        ("1-5/2/3 * * * *", "minute"),
        ("0x1 * * * *", "minute"),
        ("1.5 * * * *", "minute"),
        ("-1 * * * *", "minute"),
        ("+5 * * * *", "minute"),
        ("** * * * *", "minute"),
        ("* * * * */mon", "day-of-week"),
        ("* 1e2 * * *", "hour"),
        ("", "expression"),
        ("  \t ", "expression"),
    ],
)
def test_syntax(expr: str, field: str) -> None:
    check(expr, "syntax", field)


@pytest.mark.parametrize("expr", ["* * * *", "* * * * * *", "* * * * * * *", "1 - 5 * * * *", "*"])
def test_field_count(expr: str) -> None:
    check(expr, "field-count", "expression")


@pytest.mark.parametrize(
    ("expr", "field", "detail"),
    [
        ("60 * * * *", "minute", "60 is outside 0-59"),
        ("* 24 * * *", "hour", "24 is outside 0-23"),
        ("* * 0 * *", "day-of-month", "0 is outside 1-31"),
        ("* * 32 * *", "day-of-month", "32 is outside 1-31"),
        ("* * * 13 *", "month", "13 is outside 1-12"),
        ("* * * * 8", "day-of-week", "8 is outside 0-7"),
        ("0-60 * * * *", "minute", "60 is outside 0-59"),
        ("50-70/30 * * * *", "minute", "70 is outside 0-59"),
    ],
)
def test_out_of_range(expr: str, field: str, detail: str) -> None:
    check(expr, "out-of-range", field)
    assert str(rejected(expr)) == f"{field}: out-of-range: {detail}"


@pytest.mark.parametrize("expr", ["*/0 * * * *", "0-59/0 * * * *", "*/00 * * * *"])
def test_step_zero(expr: str) -> None:
    check(expr, "step-zero", "minute")


@pytest.mark.parametrize(
    ("expr", "field"),
    [
        ("5-1 * * * *", "minute"),
        ("* 22-2 * * *", "hour"),
        ("* * * * sat-sun", "day-of-week"),
        ("* * * * mon-sun", "day-of-week"),
        ("* * * * fri-mon", "day-of-week"),
        ("* * * dec-jan *", "month"),
        ("* * * * 7-1", "day-of-week"),
    ],
)
def test_reversed_range(expr: str, field: str) -> None:
    check(expr, "reversed-range", field)


@pytest.mark.parametrize("expr", ["1,,2 * * * *", "1, * * * *", ",1 * * * *"])
def test_empty_element(expr: str) -> None:
    check(expr, "empty-element", "minute")


@pytest.mark.parametrize(
    ("expr", "field"),
    [
        ("* * * * monday", "day-of-week"),
        ("* * * january *", "month"),
        ("* * * jan-dez *", "month"),
        ("* * * * jan", "day-of-week"),
        ("* * * mon *", "month"),
        ("mon * * * *", "minute"),
        ("* jan * * *", "hour"),
        ("* * fri * *", "day-of-month"),
    ],
)
def test_unknown_name(expr: str, field: str) -> None:
    check(expr, "unknown-name", field)


@pytest.mark.parametrize(
    ("expr", "field"),
    [("5/15 * * * *", "minute"), ("* * * * wed/1", "day-of-week"), ("* 3/2 * * *", "hour")],
)
def test_single_value_step(expr: str, field: str) -> None:
    check(expr, "single-value-step", field)


@pytest.mark.parametrize(
    ("expr", "field"),
    [
        ("0 0 L * *", "day-of-month"),
        ("0 0 15W * *", "day-of-month"),
        ("0 0 LW * *", "day-of-month"),
        ("0 0 * * 1#2", "day-of-week"),
        ("0 0 * * 5L", "day-of-week"),
        ("0 0 ? * *", "day-of-month"),
        ("H * * * *", "minute"),
        ("H/15 * * * *", "minute"),
    ],
)
def test_unsupported_extension(expr: str, field: str) -> None:
    check(expr, "unsupported-extension", field)


@pytest.mark.parametrize("expr", ["@reboot", "@foo", "@daily *", "@ daily", "@", "@hourly 5"])
def test_macro(expr: str) -> None:
    check(expr, "macro", "expression")


@pytest.mark.parametrize(
    "expr",
    [
        "@every",
        "@every 0s",
        "@every 0h0m0s",
        "@every 5",
        "@every 1.5h",
        "@every -5m",
        "@every +5m",
        "@every 30m1h",
        "@every 1h1h",
        "@every 1h 30m",
        "@every 5 m",
        "@every 500ms",
        "@every 1w",
        "@every 5x",
        "@every 1h30",
        "@every h",
        "@every5m",
    ],
)
def test_every_duration(expr: str) -> None:
    check(expr, "every-duration", "every")


@pytest.mark.parametrize(
    "expr",
    [
        "0 0 * * *\n",
        "0\u00a00 * * *",
        "0 1\u20133 * * *",
        "\u0665 * * * *",
        "\uff15 * * * *",
        "0 0 * * *\r",
        "0 0 * * *\x00",
    ],
)
def test_illegal_character(expr: str) -> None:
    check(expr, "illegal-character", "expression")


@pytest.mark.parametrize(
    "expr",
    [
        "0 0 31 2 *",
        "0 0 30 2 *",
        "0 0 30,31 2 *",
        "0 0 31 4,6,9,11 *",
        "0 0 31 2 */7",
        "0 0 30 2 */2",
    ],
)
def test_never_fires(expr: str) -> None:
    check(expr, "never-fires", "expression")


def test_unknown_zone_is_a_schedule_error() -> None:
    for tz in ("Mars/Olympus", "", "../etc/passwd", "/etc/passwd", "Europe/", "UTC ", "localtime"):
        with pytest.raises(CronError) as info:
            parse("0 0 * * *", tz=tz)
        assert (info.value.code, info.value.field) == ("unknown-zone", "timezone")


def test_naive_after_is_rejected() -> None:
    with pytest.raises(CronError) as info:
        next_fires("0 0 * * *", datetime(2024, 1, 1))  # noqa: DTZ001 - the point of the test
    assert (info.value.code, info.value.field) == ("naive-datetime", "after")
    with pytest.raises(CronError) as info:
        next_fires("@every 1h", datetime(2024, 1, 1))  # noqa: DTZ001
    assert info.value.field == "after"


def test_naive_anchor_is_rejected() -> None:
    with pytest.raises(CronError) as info:
        parse("@every 1h", anchor=datetime(2024, 1, 1))  # noqa: DTZ001
    assert (info.value.code, info.value.field) == ("naive-datetime", "anchor")


def test_non_string_expression_is_rejected() -> None:
    with pytest.raises(CronError) as info:
        validate(5)  # type: ignore[arg-type]
    assert info.value.code == "syntax"


def test_cron_error_is_config_error_and_value_error() -> None:
    err = rejected("60 * * * *")
    assert isinstance(err, ConfigError)
    assert isinstance(err, ValueError)
    assert err.field == "minute"
    assert err.code in CODES


@pytest.mark.parametrize(
    "expr",
    [
        "0 0 29 2 *",
        "0 0 31 2 mon",
        "0 0 31 2 1",
        "00 09 * * *",
        "007 * * * *",
        "  0 0 * * *\t",
        "0\t0\t*\t*\t*",
        "0   0 * * *",
        "*/60 * * * *",
        "0 0-23/25 * * *",
        "0 0 * JAN-Jun/2 Mon-5",
        "0 0 * * 1-fri",
        "*,30 1,* * * *",
        "@DAILY",
        "@Every 1H30M",
        "@every 90m",
        "@every 0h5m",
        "@every 1d1h1m1s",
        "@every 86399s",
        "  @hourly  ",
        "5-5 * * * *",
        "0 0 * * 7",
        "0 0 * * 0-7",
    ],
)
def test_accepted_forms(expr: str) -> None:
    validate(expr)


def test_validation_is_well_under_a_millisecond() -> None:
    clear_caches()
    exprs = [
        f"{m} {h}-23/2 1-{d} * mon-fri" for m in range(10) for h in range(10) for d in (28, 29)
    ]
    t0 = time.perf_counter()
    for e in exprs:
        validate(e)
    per_call = (time.perf_counter() - t0) / len(exprs)
    assert per_call < 0.0005, per_call
    t0 = time.perf_counter()
    with pytest.raises(CronError):
        validate("0 0 31 4,6,9,11 *")
    assert time.perf_counter() - t0 < 0.001


def test_every_anchor_sets_the_phase_of_any_zone() -> None:
    anchor = datetime(2024, 1, 1, 0, 10, tzinfo=UTC)
    assert next_fires("@every 90m", anchor, 1, tz="Asia/Kathmandu", anchor=anchor) == [
        datetime(2024, 1, 1, 1, 40, tzinfo=UTC)
    ]


# --- hostile numbers and instants (issue 10) -----------------------------------------------

PLUS_14 = timezone(timedelta(hours=14))
MINUS_14 = timezone(timedelta(hours=-14))


@pytest.mark.parametrize(
    ("expr", "field", "code"),
    [
        ("1" + "0" * 5000 + " * * * *", "minute", "out-of-range"),
        ("* " + "9" * 4301 + " * * *", "hour", "out-of-range"),
        ("0 0 1-" + "3" * 5000 + " * *", "day-of-month", "out-of-range"),
        ("@every " + "1" * 5000 + "s", "every", "every-duration"),
        ("@every " + "9" * 20 + "d", "every", "every-duration"),
    ],
)
def test_numbers_of_any_length_are_a_cron_error_not_a_value_error(
    expr: str, field: str, code: str
) -> None:
    check(expr, code, field)


def test_a_step_of_any_length_selects_the_first_value() -> None:
    # Larger than the field's range: only the range's first value (it used to reach int()).
    after = datetime(2024, 1, 1, tzinfo=UTC)
    assert next_fires("0 */" + "7" * 5000 + " * * *", after) == [datetime(2024, 1, 2, tzinfo=UTC)]


def test_leading_zeros_of_any_length_are_allowed() -> None:
    zeros = "0" * 5000
    after = datetime(2024, 1, 1, tzinfo=UTC)
    assert next_fires(f"{zeros}5 {zeros} * * *", after) == [datetime(2024, 1, 1, 0, 5, tzinfo=UTC)]
    assert next_fires(f"@every {zeros}90s", after) == [datetime(2024, 1, 1, 0, 1, 30, tzinfo=UTC)]
    check(f"{zeros}60 * * * *", "out-of-range", "minute")


@pytest.mark.parametrize("after", ["2024-01-01T00:00:00Z", 1_700_000_000, None, date(2024, 1, 1)])
@pytest.mark.parametrize("expr", ["*/5 * * * *", "@every 5m"])
def test_after_that_is_no_datetime_is_a_clear_type_error(expr: str, after: object) -> None:
    with pytest.raises(TypeError, match="after must be an aware datetime, not "):
        parse(expr).next_after(after)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="after must be an aware datetime, not "):
        next_fires(expr, after)  # type: ignore[arg-type]


def test_an_aware_time_of_day_is_no_instant_either() -> None:
    with pytest.raises(TypeError, match="after must be an aware datetime, not time"):
        parse("0 * * * *").next_after(time_of_day(12, tzinfo=UTC))  # type: ignore[arg-type]


def test_a_naive_after_is_both_a_cron_error_and_a_type_error() -> None:
    with pytest.raises(TypeError) as info:
        parse("0 * * * *").next_after(datetime(2024, 1, 1))  # noqa: DTZ001
    assert isinstance(info.value, CronError) and info.value.code == "naive-datetime"


@pytest.mark.parametrize(
    "anchor",
    [
        datetime(1, 1, 1, tzinfo=PLUS_14),  # before year 1 in UTC: astimezone overflows
        datetime(1, 1, 1, 12, tzinfo=UTC),
        datetime(9999, 12, 31, 23, tzinfo=MINUS_14),  # after 9999 in UTC
        datetime(9999, 12, 30, 0, 0, 1, tzinfo=UTC),
    ],
)
@pytest.mark.parametrize("expr", ["@every 1h", "0 0 * * *"])
def test_anchor_at_the_ends_of_the_datetime_range_is_out_of_range(
    expr: str, anchor: datetime
) -> None:
    with pytest.raises(CronError) as info:
        parse(expr, anchor=anchor)
    assert (info.value.field, info.value.code) == ("anchor", "out-of-range")


def test_anchor_inside_the_range_phases_the_interval() -> None:
    after = datetime(2024, 1, 1, 0, 0, 30, tzinfo=UTC)
    assert next_fires("@every 1h", after, anchor=ANCHOR_MIN) == [
        datetime(2024, 1, 1, 1, tzinfo=UTC)
    ]
    assert next_fires("@every 1m", after, anchor=ANCHOR_MAX) == [
        datetime(2024, 1, 1, 0, 1, tzinfo=UTC)
    ]
