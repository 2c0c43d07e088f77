"""The public surface the rest of the product and the acceptance checks use."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

import periodic_manager.cron as cron
from periodic_manager.cron import CronError, Schedule, next_fires, parse


def test_exported_members() -> None:
    assert set(cron.__all__) >= {"CronError", "Schedule", "parse", "validate", "next_fires", "UTC"}
    for name in cron.__all__:
        assert hasattr(cron, name)
    assert cron.UTC is UTC
    assert issubclass(CronError, ValueError)


def test_results_are_aware_utc_and_strictly_after() -> None:
    slot = datetime(2024, 1, 1, 6, tzinfo=UTC)
    got = next_fires("0 6 * * *", slot, 2)
    assert got == [slot + timedelta(days=1), slot + timedelta(days=2)]
    assert all(t.tzinfo is UTC for t in got)
    assert next_fires("0 6 * * *", slot - timedelta(microseconds=1)) == [slot]


def test_after_in_another_offset_only_its_instant_matters() -> None:
    after = datetime(2024, 1, 1, 12, tzinfo=timezone(timedelta(hours=-7, minutes=-30)))
    assert next_fires("0 * * * *", after) == next_fires("0 * * * *", after.astimezone(UTC))


def test_n_zero_and_negative() -> None:
    after = datetime(2024, 1, 1, tzinfo=UTC)
    assert next_fires("* * * * *", after, 0) == []
    with pytest.raises(ValueError):
        next_fires("* * * * *", after, -1)


def test_schedule_next_after_matches_next_fires_and_resumes_from_last_slot() -> None:
    sched = parse("*/20 1-3 * * *", tz="America/New_York")
    assert isinstance(sched, Schedule)
    assert (sched.expr, sched.tz) == ("*/20 1-3 * * *", "America/New_York")
    after = datetime(2024, 11, 2, tzinfo=UTC)
    many = sched.next_fires(after, 20)
    walked, t = [], after
    for _ in range(20):
        t = sched.next_after(t)
        walked.append(t)
    assert walked == many
    assert many == sorted(set(many))


def test_identical_triples_share_one_schedule() -> None:
    assert parse("0 6 * * *", "Europe/Berlin") is parse("0 6 * * *", "Europe/Berlin")
    assert parse("0 6 * * *", "Europe/Berlin") is not parse("0 6 * * *", "UTC")
    anchor = datetime(2024, 1, 1, tzinfo=UTC)
    assert parse("@every 1h", anchor=anchor) is parse("@every 1h", anchor=anchor)
    assert parse("@every 1h", anchor=anchor) is not parse("@every 1h")


def test_expression_parsed_once_for_all_zones() -> None:
    cron.clear_caches()
    zones = ["UTC", "Europe/Berlin", "Asia/Kathmandu", "America/Sao_Paulo"]
    exprs = [f"{m} 3 * * *" for m in range(25)]
    for e in exprs:
        for tz in zones:
            parse(e, tz)
    info = cron._compile.cache_info()
    assert info.misses == len(exprs)
    specs = {id(parse(e, tz).spec) for e in exprs[:1] for tz in zones}  # type: ignore[attr-defined]
    assert len(specs) == 1


def test_engine_reads_no_clock() -> None:
    # Same answers whatever "now" is: the engine has no clock; results depend on `after` only.
    after = datetime(2030, 5, 5, 5, 5, tzinfo=UTC)
    assert next_fires("5 5 5 5 *", after) == [datetime(2031, 5, 5, 5, 5, tzinfo=UTC)]


def test_error_message_names_field_and_reason() -> None:
    with pytest.raises(CronError, match=r"^minute: out-of-range: 60 is outside 0-59$"):
        next_fires("60 * * * *", datetime(2024, 1, 1, tzinfo=UTC))


def test_expressions_with_the_same_fields_share_their_tables() -> None:
    # A million schedules repeat a few day fields: each distinct field set is held once, and the
    # answers do not depend on which expression built the shared table first.
    a = parse("5 3 * * 1-5")
    b = parse("17 22 * * 1-5")
    c = parse("0 0 1 1,7 *")
    assert a.spec.doms is b.spec.doms and a.spec.months is b.spec.months  # type: ignore[attr-defined]
    assert a.spec.dows is b.spec.dows  # type: ignore[attr-defined]
    assert a._table._dow is b._table._dow and a._table._succ is b._table._succ  # type: ignore[attr-defined]
    assert a._table._succ is not c._table._succ  # type: ignore[attr-defined]
    after = datetime(2024, 3, 1, tzinfo=UTC)  # a Friday
    assert next_fires("17 22 * * 1-5", after, 2) == [
        datetime(2024, 3, 1, 22, 17, tzinfo=UTC),
        datetime(2024, 3, 4, 22, 17, tzinfo=UTC),
    ]
    assert next_fires("0 0 1 1,7 *", after) == [datetime(2024, 7, 1, tzinfo=UTC)]
