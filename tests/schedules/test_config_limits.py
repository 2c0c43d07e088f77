"""Every number and duration of a schedule is range-checked before it can meet datetime
arithmetic, and JSON documents are bounded in depth and size: the one validation that the API,
the manager and the import share (``PeriodicTaskConfig.create``)."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from periodic_manager.errors import ConfigError
from periodic_manager.schedules.definition import PeriodicTaskConfig, content_hash
from periodic_manager.schedules.rules import (
    MAX_DURATION_S,
    MAX_JSON_DEPTH,
    PendingJson,
    canonical_json,
    canonical_text,
)

HUGE = 10**400
DAY = 86_400


def make(**fields: Any) -> PeriodicTaskConfig:
    return PeriodicTaskConfig.create(
        **{"name": "n", "spec": "* * * * *", "task_type": "t", **fields}
    )


def refused(field: str, **fields: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        make(**fields)
    assert info.value.field == field, info.value
    return info.value


@pytest.mark.parametrize("key", ["timeout", "unique_ttl", "catchup_window"])
@pytest.mark.parametrize(
    "value", [HUGE, -HUGE, 1e300, 1e12, 1e11, MAX_DURATION_S + 1, math.inf, math.nan, 0, -1, True]
)
def test_duration_options_out_of_range_are_refused_with_a_reason(key: str, value: Any) -> None:
    err = refused(f"options.{key}", options={key: value})
    assert "at most 31622400 (366 days)" in err.reason


@pytest.mark.parametrize("key", ["timeout", "unique_ttl", "catchup_window"])
def test_duration_options_up_to_366_days_are_accepted(key: str) -> None:
    for value in (0.001, 1, 3600.5, MAX_DURATION_S):
        assert make(options={key: value}).options[key] == value


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_retry": HUGE}, "options.max_retry"),
        ({"max_retry": 1001}, "options.max_retry"),
        ({"max_retry": -1}, "options.max_retry"),
        ({"max_retry": 1.0}, "options.max_retry"),
        ({"extra": {"priority": 256}}, "options.extra.priority"),
        ({"extra": {"priority": HUGE}}, "options.extra.priority"),
        ({"extra": {"priority": 1.5}}, "options.extra.priority"),
        ({"extra": {"expires": HUGE}}, "options.extra.expires"),
        ({"extra": {"expires": math.inf}}, "options.extra.expires"),
        ({"extra": {"soft_time_limit": 1e300}}, "options.extra.soft_time_limit"),
        ({"extra": {"soft_time_limit": -5}}, "options.extra.soft_time_limit"),
        ({"extra": {"routing_key": ""}}, "options.extra.routing_key"),
        ({"extra": {"exchange": 5}}, "options.extra.exchange"),
    ],
)
def test_counts_and_known_extra_keys_are_range_checked(options: dict[str, Any], field: str) -> None:
    refused(field, options=options)


def test_known_extra_keys_within_bounds_and_unknown_ones_pass() -> None:
    extra = {
        "priority": 255,
        "expires": 60,
        "soft_time_limit": 30.5,
        "routing_key": "r",
        "exchange": "x",
        "anything": {"else": [1e300, HUGE]},  # passed through to workers unchecked
    }
    assert make(options={"max_retry": 1000, "extra": extra}).options["extra"] == extra


def test_every_at_most_36500_days() -> None:
    make(spec="@every 36500d")
    err = refused("spec", spec="@every 36501d")
    assert err.code == "every-duration"
    refused("spec", spec="@every 999999999d")


def test_anchor_out_of_range_names_the_anchor() -> None:
    plus_14 = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))
    assert refused("anchor", spec="@every 1h", anchor=plus_14).code == "out-of-range"
    refused("anchor", spec="@every 1h", anchor=datetime(9999, 12, 31, tzinfo=UTC))


def nested(depth: int) -> Any:
    doc: Any = 1
    for _ in range(depth):
        doc = [doc]
    return doc


@pytest.mark.parametrize("field", ["payload", "options"])
def test_json_nested_deeper_than_100_is_refused(field: str) -> None:
    def wrap(depth: int) -> dict[str, Any]:
        # options must be an object: the nesting goes into extra, one level per container
        return {field: nested(depth) if field == "payload" else {"extra": {"k": nested(depth - 2)}}}

    make(**wrap(MAX_JSON_DEPTH))
    assert "nested deeper than 100" in refused(field, **wrap(MAX_JSON_DEPTH + 1)).reason
    assert "nested deeper than 100" in refused(field, **wrap(900)).reason


def test_deep_documents_with_few_brackets_in_strings_are_not_refused() -> None:
    payload = {"text": "[" * 500 + "{" * 500}  # brackets in a string are no nesting
    assert make(payload=payload).payload == payload


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"k": "a\x00b"}, "must not contain NUL characters"),
        ({"a\x00": 1}, "must not contain NUL characters"),
        (["\ud800"], "unpaired surrogate"),
        (math.nan, "must be a JSON value"),
    ],
)
def test_payload_that_no_backend_stores_is_refused(payload: Any, reason: str) -> None:
    assert reason in refused("payload", payload=payload).reason


def test_size_limit_counts_utf8_bytes_of_canonical_json() -> None:
    # {"a":"ééé"}: 11 characters, 3 of them two bytes long: 14 bytes
    assert make(payload={"a": "ééé"}, max_payload_bytes=14).payload_json == '{"a":"ééé"}'
    err = refused("payload", payload={"a": "ééé"}, max_payload_bytes=13)
    assert err.code == "too-large" and "14 bytes" in err.reason
    err = refused("options", options={"queue": "q" * 20}, max_payload_bytes=20)
    assert err.code == "too-large"
    # The default: 64 KiB.
    make(payload="x" * 65_534)
    assert refused("payload", payload="x" * 65_535).code == "too-large"


def test_canonical_texts_are_computed_once_and_kept_as_the_only_payload_form() -> None:
    cfg = make(payload={"b": 1, "a": 2}, options={"queue": "q"})
    # Validation made both texts; they are kept (the payload only as text, parsed on demand).
    assert cfg.payload_json == '{"a":2,"b":1}' and cfg._options_json == '{"queue":"q"}'
    assert cfg.payload == {"a": 2, "b": 1} and not hasattr(cfg, "__dict__")


def test_a_null_extra_key_means_not_set_as_the_targets_read_it() -> None:
    extra = {"priority": None, "expires": None, "soft_time_limit": None, "routing_key": None}
    assert make(options={"extra": extra}).options["extra"] == extra


@pytest.mark.parametrize(
    "text",
    [
        '{"n": 1}',
        ' {"b": 1, "a": [1.50, 1e3, -0, "\\u00e9\\n", null, true, {"z": {}, "y": []}]} \n',
        '"x"',
        "3",
        "[]",
        '{"long": 123456789012345678901234567890}',
        '{"é": "ü", "a": "\\"\\\\"}',
    ],
)
def test_canonical_text_of_a_json_text_is_its_canonical_json(text: str) -> None:
    # The cold start's path (a payload text a database gave): the same text as parsing and
    # encoding it canonically, blanks around the document included.
    assert canonical_text(text) == canonical_json(json.loads(text))
    config = PeriodicTaskConfig("x", "* * * * *", "t", payload_json=PendingJson(text))
    assert config.payload_json == canonical_json(json.loads(text))


@pytest.mark.parametrize("text", ["", "[1] x", '{"a": 1', "  ", '{"a": NaN}'])
def test_canonical_text_refuses_what_json_refuses(text: str) -> None:
    with pytest.raises(ValueError) as expected:
        canonical_json(json.loads(text))
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
        canonical_text(text)


def test_content_hash_is_the_digest_stored_and_compared_elsewhere() -> None:
    # Stored (pm_entries, last good versions) and recomputed by the API from rows: its text
    # must not change with how it is computed. Digests of the previous implementation.
    plain = PeriodicTaskConfig(
        "x",
        "*/5 * * * *",
        "reports.build",
        payload={"b": [1, "é"], "a": None},
        options={"queue": "q1"},
        timezone="Europe/Berlin",
    )
    anchored = PeriodicTaskConfig(
        "y",
        "@every 90m",
        "t",
        anchor=datetime(2030, 1, 2, 3, 4, 5, 6, tzinfo=timezone(timedelta(hours=2))),
    )
    assert content_hash(plain) == "37e32fda0801934f85084f3ffcd779ec03264eac26d01d62d819f1787600a3e6"
    assert (
        content_hash(anchored) == "2f4dc44a009a3bfe64788d89b439c11723cf5776f21ddf8143dffee0f2186632"
    )
