"""DST and odd-offset behaviour (docs/cron.md §8): one test per transition case, named after
what it proves; expected values in UTC, local in comments. The page's own worked examples are
checked by tests/project/test_docs.py."""

from __future__ import annotations

from datetime import UTC, datetime

from periodic_manager.cron import next_fires


def at(text: str) -> datetime:
    """An aware instant from ISO text with an explicit offset."""
    value = datetime.fromisoformat(text)
    assert value.tzinfo is not None
    return value


def z(text: str) -> datetime:
    """A UTC instant from 'YYYY-MM-DD HH:MM[:SS]'."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def fires(expr: str, after: str, n: int, tz: str) -> list[datetime]:
    result = next_fires(expr, at(after), n, tz=tz)
    assert all(r.tzinfo is UTC for r in result)
    return result


BERLIN = "Europe/Berlin"


# --- Europe/Berlin, spring 2024-03-31 (gap 02:00-02:59, G = 1 h) -------------------------


def test_nonexistent_time_fixed_hour_is_shifted_by_gap_size() -> None:
    assert fires("30 2 * * *", "2024-03-30T12:00+01:00", 2, BERLIN) == [
        z("2024-03-31 01:30"),  # 03:30+02
        z("2024-04-01 00:30"),  # 02:30+02
    ]


def test_nonexistent_times_keep_every_slot_when_shifted() -> None:
    assert fires("0,30 2 * * *", "2024-03-30T12:00+01:00", 4, BERLIN) == [
        z("2024-03-31 01:00"),
        z("2024-03-31 01:30"),
        z("2024-04-01 00:00"),
        z("2024-04-01 00:30"),
    ]


def test_shifted_run_coinciding_with_real_run_fires_once() -> None:
    assert fires("30 2,3 * * *", "2024-03-30T12:00+01:00", 3, BERLIN) == [
        z("2024-03-31 01:30"),  # 02:30 -> 03:30 merged with the real 03:30
        z("2024-04-01 00:30"),
        z("2024-04-01 01:30"),
    ]


def test_nonexistent_time_wildcard_hour_is_skipped() -> None:
    assert fires("*/30 * * * *", "2024-03-31T01:15+01:00", 3, BERLIN) == [
        z("2024-03-31 00:30"),  # 01:30+01
        z("2024-03-31 01:00"),  # 03:00+02, no 02:xx
        z("2024-03-31 01:30"),
    ]


def test_nonexistent_hour_every_minute_fixed_hour_shifts_each_minute() -> None:
    got = fires("* 2 * * *", "2024-03-31T01:59+01:00", 61, BERLIN)
    assert got[:60] == [z(f"2024-03-31 01:{m:02d}") for m in range(60)]  # 03:mm+02
    assert got[60] == z("2024-04-01 00:00")  # 02:00+02 the next day


def test_nonexistent_hour_wildcard_step_hour_is_skipped() -> None:
    assert fires("0 */2 * * *", "2024-03-30T23:30+01:00", 2, BERLIN) == [
        z("2024-03-30 23:00"),  # 00:00+01
        z("2024-03-31 02:00"),  # 04:00+02
    ]


def test_nonexistent_hour_range_step_hour_is_fixed_and_shifted() -> None:
    assert fires("0 0-23/2 * * *", "2024-03-30T23:30+01:00", 3, BERLIN) == [
        z("2024-03-30 23:00"),  # 00:00+01
        z("2024-03-31 01:00"),  # 03:00+02 (shifted 02:00)
        z("2024-03-31 02:00"),  # 04:00+02
    ]


# --- Europe/Berlin, autumn 2024-10-27 (02:00-02:59 twice) ----------------------------------


def test_repeated_hour_fixed_hour_fires_first_pass_only() -> None:
    assert fires("30 2 * * *", "2024-10-26T12:00+02:00", 2, BERLIN) == [
        z("2024-10-27 00:30"),  # 02:30+02
        z("2024-10-28 01:30"),  # 02:30+01 the next day; no 01:30Z on the 27th
    ]


def test_repeated_hour_wildcard_hour_fires_both_passes() -> None:
    assert fires("*/30 * * * *", "2024-10-27T01:45+02:00", 4, BERLIN) == [
        z("2024-10-27 00:00"),
        z("2024-10-27 00:30"),
        z("2024-10-27 01:00"),
        z("2024-10-27 01:30"),
    ]


def test_repeated_hour_minute_step_with_fixed_hour_fires_first_pass_only() -> None:
    assert fires("*/15 2 * * *", "2024-10-27T01:50+02:00", 5, BERLIN) == [
        z("2024-10-27 00:00"),
        z("2024-10-27 00:15"),
        z("2024-10-27 00:30"),
        z("2024-10-27 00:45"),
        z("2024-10-28 01:00"),  # 02:00+01
    ]


def test_repeated_hour_hour_range_is_fixed_hour() -> None:
    assert fires("0 1-3 * * *", "2024-10-27T01:50+02:00", 2, BERLIN) == [
        z("2024-10-27 00:00"),  # 02:00+02
        z("2024-10-27 02:00"),  # 03:00+01; 02:00+01 is not a fire time
    ]


def test_repeated_hour_wildcard_step_hour_fires_both_passes() -> None:
    assert fires("0 */2 * * *", "2024-10-27T01:50+02:00", 2, BERLIN) == [
        z("2024-10-27 00:00"),  # 02:00+02
        z("2024-10-27 01:00"),  # 02:00+01
    ]


def test_start_in_second_pass_does_not_resurrect_fixed_hour_slot() -> None:
    assert fires("30 2 * * *", "2024-10-27T02:10+01:00", 1, BERLIN) == [z("2024-10-28 01:30")]


# --- America/New_York ----------------------------------------------------------------------


def test_new_york_nonexistent_time_shifted_then_daily() -> None:
    assert fires("30 2 * * *", "2024-03-09T12:00-05:00", 2, "America/New_York") == [
        z("2024-03-10 07:30"),  # 03:30-04
        z("2024-03-11 06:30"),  # 02:30-04
    ]


def test_new_york_shifted_run_merges_with_real_run() -> None:
    assert fires("30 1-3 * * *", "2024-03-10T00:00-05:00", 3, "America/New_York") == [
        z("2024-03-10 06:30"),  # 01:30-05
        z("2024-03-10 07:30"),  # 03:30-04 (02:30 shifted, merged)
        z("2024-03-11 05:30"),  # 01:30-04
    ]


def test_new_york_repeated_hour_fixed_hour_fires_once() -> None:
    assert fires("30 1 * * *", "2024-11-02T12:00-04:00", 2, "America/New_York") == [
        z("2024-11-03 05:30"),  # 01:30-04 only
        z("2024-11-04 06:30"),  # 01:30-05
    ]


def test_new_york_repeated_hour_wildcard_fires_both_passes() -> None:
    assert fires("0 * * * *", "2024-11-03T00:30-04:00", 3, "America/New_York") == [
        z("2024-11-03 05:00"),  # 01:00-04
        z("2024-11-03 06:00"),  # 01:00-05
        z("2024-11-03 07:00"),  # 02:00-05
    ]


# --- America/Sao_Paulo (transitions at midnight) -------------------------------------------


def test_nonexistent_midnight_daily_is_shifted_and_keeps_nominal_date() -> None:
    assert fires("@daily", "2018-11-03T12:00-03:00", 2, "America/Sao_Paulo") == [
        z("2018-11-04 03:00"),  # 01:00-02
        z("2018-11-05 02:00"),  # 00:00-02
    ]


def test_day_matching_uses_nominal_date_of_nonexistent_midnight() -> None:
    assert fires("0 0 4 11 *", "2018-11-01T00:00-03:00", 2, "America/Sao_Paulo") == [
        z("2018-11-04 03:00"),
        z("2019-11-04 03:00"),
    ]


def test_repeated_hour_on_previous_date_fixed_hour_fires_once() -> None:
    assert fires("30 23 * * *", "2019-02-16T12:00-02:00", 2, "America/Sao_Paulo") == [
        z("2019-02-17 01:30"),  # 23:30-02 on Saturday Feb 16
        z("2019-02-18 02:30"),
    ]


def test_repeated_hour_minute_step_fixed_hour_first_pass_only_sao_paulo() -> None:
    assert fires("*/30 23 * * *", "2019-02-16T12:00-02:00", 3, "America/Sao_Paulo") == [
        z("2019-02-17 01:00"),
        z("2019-02-17 01:30"),
        z("2019-02-18 02:00"),  # 23:00-03
    ]


def test_repeated_hour_wildcard_fires_both_passes_sao_paulo() -> None:
    assert fires("*/30 * * * *", "2019-02-16T22:50-02:00", 5, "America/Sao_Paulo") == [
        z("2019-02-17 01:00"),  # 23:00-02
        z("2019-02-17 01:30"),  # 23:30-02
        z("2019-02-17 02:00"),  # 23:00-03
        z("2019-02-17 02:30"),  # 23:30-03
        z("2019-02-17 03:00"),  # 00:00-03 Feb 17
    ]


# --- Australia/Lord_Howe (30-minute DST) ---------------------------------------------------

LORD_HOWE = "Australia/Lord_Howe"


def test_half_hour_gap_shifted_runs_merge_with_real_runs() -> None:
    assert fires("0,15,30,45 2 * * *", "2024-10-05T12:00+00:00", 4, LORD_HOWE) == [
        z("2024-10-05 15:30"),  # 02:30+11, from 02:00 and the real 02:30
        z("2024-10-05 15:45"),  # 02:45+11, from 02:15 and the real 02:45
        z("2024-10-06 15:00"),  # next day 02:00+11
        z("2024-10-06 15:15"),
    ]


def test_shifted_run_can_come_after_a_later_nominal_time() -> None:
    assert fires("20,40 2 * * *", "2024-10-05T12:00+00:00", 2, LORD_HOWE) == [
        z("2024-10-05 15:40"),  # 02:40+11, real
        z("2024-10-05 15:50"),  # 02:50+11, the shifted 02:20
    ]


def test_half_hour_gap_wildcard_hour_skips() -> None:
    assert fires("0 * * * *", "2024-10-06T00:30+10:30", 2, LORD_HOWE) == [
        z("2024-10-05 14:30"),  # 01:00+10:30
        z("2024-10-05 16:00"),  # 03:00+11; 02:00 skipped
    ]


def test_half_hour_fold_fixed_hour_fires_once() -> None:
    assert fires("45 1 * * *", "2024-04-06T00:00+00:00", 2, LORD_HOWE) == [
        z("2024-04-06 14:45"),  # 01:45+11 only
        z("2024-04-07 15:15"),  # 01:45+10:30 the next day
    ]


def test_half_hour_fold_minute_step_fixed_hour_first_pass_only() -> None:
    assert fires("*/15 1 * * *", "2024-04-07T01:20+11:00", 4, LORD_HOWE) == [
        z("2024-04-06 14:30"),  # 01:30+11
        z("2024-04-06 14:45"),  # 01:45+11
        z("2024-04-07 14:30"),  # 01:00+10:30 the next day
        z("2024-04-07 14:45"),  # 01:15+10:30
    ]


def test_half_hour_fold_wildcard_fires_both_passes() -> None:
    assert fires("*/15 * * * *", "2024-04-07T01:20+11:00", 5, LORD_HOWE) == [
        z("2024-04-06 14:30"),  # 01:30+11
        z("2024-04-06 14:45"),  # 01:45+11
        z("2024-04-06 15:00"),  # 01:30+10:30
        z("2024-04-06 15:15"),  # 01:45+10:30
        z("2024-04-06 15:30"),  # 02:00+10:30
    ]


# --- Non-hour offsets ----------------------------------------------------------------------


def test_quarter_hour_offset_without_dst() -> None:
    got = fires("30 9 * * *", "2024-05-01T00:00+00:00", 3, "Asia/Kathmandu")
    assert got == [z("2024-05-01 03:45"), z("2024-05-02 03:45"), z("2024-05-03 03:45")]


def test_quarter_hour_gap_shifts_out_of_nominal_order() -> None:
    assert fires("0,10,20 0 1 1 *", "1985-12-31T12:00+00:00", 4, "Asia/Kathmandu") == [
        z("1985-12-31 18:30"),  # 00:15+05:45, shifted 00:00
        z("1985-12-31 18:35"),  # 00:20, real
        z("1985-12-31 18:40"),  # 00:25, shifted 00:10
        z("1986-12-31 18:15"),  # 1987-01-01 00:00+05:45
    ]


def test_chatham_gap_at_quarter_to_three_is_shifted() -> None:
    assert fires("50 2 * * *", "2024-09-28T00:00+00:00", 1, "Pacific/Chatham") == [
        z("2024-09-28 14:05")  # 03:50+13:45
    ]


def test_chatham_shifted_run_merges_with_real_run() -> None:
    assert fires("30 2-4 * * *", "2024-09-28T00:00+00:00", 3, "Pacific/Chatham") == [
        z("2024-09-28 13:45"),  # 02:30+12:45, real (before the gap)
        z("2024-09-28 14:45"),  # 04:30+13:45, 03:30 shifted and merged with the real 04:30
        z("2024-09-29 12:45"),  # 02:30+13:45 the next day
    ]


def test_half_hour_zones_adelaide_and_st_johns_shift_like_any_other() -> None:
    assert fires("30 2 * * *", "2024-10-05T00:00+00:00", 1, "Australia/Adelaide") == [
        z("2024-10-05 17:00")  # 03:30+10:30
    ]
    assert fires("30 2 * * *", "2024-03-09T12:00+00:00", 1, "America/St_Johns") == [
        z("2024-03-10 06:00")  # 03:30-02:30
    ]


# --- Other transitions in scope ------------------------------------------------------------


def test_two_hour_gap_shifted_runs_merge() -> None:
    assert fires("0 1,2,3 * * *", "2024-03-30T12:00+00:00", 3, "Antarctica/Troll") == [
        z("2024-03-31 01:00"),  # 03:00+02 from 01:00, merged with the real 03:00
        z("2024-03-31 02:00"),  # 04:00+02 from 02:00
        z("2024-03-31 23:00"),  # 01:00+02 the next day
    ]


def test_whole_skipped_day_fires_once_after_it() -> None:
    assert fires("0 9 * * *", "2011-12-29T00:00-10:00", 2, "Pacific/Apia") == [
        z("2011-12-29 19:00"),  # Dec 29 09:00-10
        z("2011-12-30 19:00"),  # Dec 31 09:00+14 (Dec 30 never existed)
    ]


def test_sub_minute_offset_gap_is_not_rounded() -> None:
    assert fires("30 0 * * *", "1972-01-04T12:00+00:00", 4, "Africa/Monrovia") == [
        z("1972-01-05 01:14:30"),
        z("1972-01-06 01:14:30"),
        z("1972-01-07 01:14:30"),  # 00:30 in the gap, shifted by 00:44:30
        z("1972-01-08 00:30"),
    ]


def test_negative_dst_encoding_behaves_like_positive() -> None:
    # Dublin's tzdata encodes winter as negative DST; the fire set is unaffected.
    assert fires("30 1 * * *", "2024-03-30T12:00+00:00", 2, "Europe/Dublin") == [
        z("2024-03-31 01:30"),  # 02:30+01, shifted
        z("2024-04-01 00:30"),
    ]
    assert fires("30 1 * * *", "2024-10-26T12:00+01:00", 2, "Europe/Dublin") == [
        z("2024-10-27 00:30"),  # 01:30+01, first pass only
        z("2024-10-28 01:30"),
    ]


def test_second_pass_of_a_rare_wildcard_hour_slot_is_found_before_a_long_search() -> None:
    # Hours {0, 23} on Feb 16 only: after the first-pass 23:30-02, the second pass 23:30-03
    # still fires (wildcard hour) although the next nominal match is a year away.
    assert fires("30 */23 16 2 *", "2019-02-17T01:30+00:00", 2, "America/Sao_Paulo") == [
        z("2019-02-17 02:30"),  # 23:30-03, second pass
        z("2020-02-16 03:30"),  # 00:30-03 a year later
    ]
