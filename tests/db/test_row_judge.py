"""The provider's RowJudge (memos for repeated values, shared strings) gives exactly the verdict
of judge.judge for every row, valid or not, on both backends' raw shapes, including rows that
repeat a value another row had (a memo hit) with a different fault elsewhere."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from periodic_manager.contracts import RowError
from periodic_manager.db import judge as dbjudge
from periodic_manager.schedules.definition import PeriodicTaskConfig

NAMES = ["job.a", "bad name!", ""]
SPECS = ["*/5 * * * *", "0 0 31 2 *", "@every 90s", "61 * * * *"]
ZONES = ["UTC", "Europe/Berlin", "Mars/Olympus"]
TYPES = ["reports.build", "", "x" * 300]
PAYLOADS = [
    '{"n": 1}',
    "not json",
    "null",
    '"' + "x" * 80 + '"',
    "[[[[1]]]]",
    "1" * 4301,
    '{"a": "\\u0000"}',
]
OPTIONS = ["{}", '{"queue": "q"}', '{"queu": "q"}', "[1]", "nope", None, '{"timeout": 1e300}']
EFFECTIVE = ["1764547200.5", None, "Infinity"]


def pg_rows() -> list[tuple[Any, ...]]:
    out = []
    combos = itertools.product(NAMES, SPECS, ZONES, TYPES, PAYLOADS, OPTIONS, EFFECTIVE)
    for i, (name, spec, zone, task_type, payload, options, eff) in enumerate(combos):
        if i % 7:  # a spread sample, repeating every value many times
            continue
        out.append((i, True, name, spec, zone, None, task_type, payload, options, eff, i * 10))
    return out


def sqlite_rows() -> list[tuple[Any, ...]]:
    def b(v: Any) -> Any:
        return v.encode() if isinstance(v, str) else v

    rows = [tuple(b(v) if 1 < k < 10 else v for k, v in enumerate(r)) for r in pg_rows()]
    rows = [(r[0], b"1", *r[2:]) for r in rows]
    # SQLite-only faults: bytes that are not UTF-8, an 'enabled' that is not 0/1.
    rows.append((10**6, b"1", b"\xff\xfe", b"* * * * *", b"UTC", None, b"t", b"1", b"{}", None, 1))
    rows.append((10**6 + 1, b"yes", b"ok", b"* * * * *", b"UTC", None, b"t", b"1", b"{}", None, 2))
    return rows


def same(a: Any, b: Any) -> bool:
    if isinstance(a, PeriodicTaskConfig) and isinstance(b, PeriodicTaskConfig):
        return a == b and a.effective_at == b.effective_at and b.revision is not None
    if isinstance(a, RowError) and isinstance(b, RowError):
        return (a.schedule_id, a.field, a.reason, a.code, a.content_hash) == (
            b.schedule_id,
            b.field,
            b.reason,
            b.code,
            b.content_hash,
        )
    return a is None and b is None


@pytest.mark.parametrize(
    "sqlite,jsonb",
    [(False, False), (False, True), (True, False)],
    ids=["postgresql-text", "postgresql-jsonb", "sqlite"],
)
def test_the_memoising_judge_agrees_with_judge_on_every_row(sqlite: bool, jsonb: bool) -> None:
    rules = dbjudge.Rules(sqlite, max_payload_bytes=5000)
    fast = dbjudge.RowJudge(rules)
    fast.jsonb = jsonb
    rows = sqlite_rows() if sqlite else pg_rows()
    if jsonb:  # a jsonb column only ever holds valid JSON
        rows = [r for r in rows if r[7] != "not json"]
    verdicts = [(dbjudge.judge(rules, r), fast(r)) for r in rows + rows]  # twice: memo hits
    assert len(rows) > 300
    assert sum(isinstance(a, PeriodicTaskConfig) for a, _ in verdicts) > 10
    assert sum(isinstance(a, RowError) for a, _ in verdicts) > 100
    mismatches = [
        (r[0], a, b) for r, (a, b) in zip(rows + rows, verdicts, strict=True) if not same(a, b)
    ]
    assert mismatches == []


def test_repeated_texts_are_shared_between_configs() -> None:
    fast = dbjudge.RowJudge(dbjudge.Rules(False))
    a = fast((1, True, "a", "*/5 * * * *", "UTC", None, "t", "1", '{"queue": "q"}', None, 1))
    b = fast(
        (
            2,
            True,
            "b",
            "".join(["*/5", " * * * *"]),
            "UTC",
            None,
            "t",
            "2",
            '{"queue": "q"}',
            None,
            1,
        )
    )
    assert isinstance(a, PeriodicTaskConfig) and isinstance(b, PeriodicTaskConfig)
    assert a.spec is b.spec and a.options is b.options


def test_the_deployment_check_is_asked_once_per_shape_and_its_verdict_holds_for_the_shape() -> None:
    """Rules.check reads a row's shape (spec, zone, task type, options): rows of a shape already
    found valid are not checked again (a cold start of 100,000 alike rows asked 100,000 times),
    and a shape the check refuses is refused on every row, as judge() says."""
    asked: list[object] = []
    inner = dbjudge.target_check(["redis"])

    def check(config: PeriodicTaskConfig) -> None:
        asked.append(config.schedule_id)
        inner(config)

    rules = dbjudge.Rules(False, check=check)
    fast = dbjudge.RowJudge(rules)
    fast.jsonb = True
    good = [
        (i, True, f"j{i}", "*/5 * * * *", "UTC", None, "t", f'{{"n": {i}}}', "{}", None, i)
        for i in range(1, 101)
    ]
    refused = [
        (i, True, f"j{i}", "*/5 * * * *", "UTC", None, "t", "1", '{"target": "celery"}', None, i)
        for i in range(101, 111)
    ]
    verdicts = [fast(r) for r in good + refused]
    assert all(isinstance(v, PeriodicTaskConfig) for v in verdicts[:100])
    assert len([x for x in asked if x in range(1, 101)]) == 1
    assert all(isinstance(v, RowError) and v.field == "options.target" for v in verdicts[100:])
    assert all(
        same(dbjudge.judge(rules, r), v) for r, v in zip(good + refused, verdicts, strict=True)
    )
