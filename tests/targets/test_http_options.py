"""The http target's write-time rule: what a schedule may ask, judged by the one judge."""

from __future__ import annotations

from typing import Any

import pytest

from periodic_manager.errors import ConfigError
from periodic_manager.schedules.rules import TargetSet, checked_options, validate_task
from periodic_manager.targets.http.options import Retry, request_of, retry_of, task_problem
from periodic_manager.targets.http.signing import sign, verify

URL = "https://hooks.example.com/in"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PM_HTTP_URL", raising=False)
    monkeypatch.delenv("PM_HTTP_ALLOW_PRIVATE", raising=False)


def problem(**options: Any) -> tuple[str, str] | None:
    found = task_problem("t", "{}", {"url": URL, **options})
    return None if found is None else (found.field, found.reason)


def test_a_plain_url_is_taken() -> None:
    assert problem() is None
    assert problem(method="PUT", headers={"X-Team": "ops"}, secret="hooks_1") is None


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"url": "ftp://x.example.com/"}, "options.url", "http:// or https://"),
        ({"url": "https://user:pw@x.example.com/"}, "options.url", "credentials"),
        ({"url": 5}, "options.url", "URL of at most"),
        ({"url": "http://127.0.0.1:8080/"}, "options.url", "PM_HTTP_ALLOW_PRIVATE"),
        ({"url": "http://localhost/"}, "options.url", "this machine"),
        ({"url": "http://[::1]/"}, "options.url", "private"),
        ({"url": "http://169.254.169.254/latest"}, "options.url", "link-local"),
        ({"url": "http://10.1.2.3/"}, "options.url", "private"),
        ({"method": "GET"}, "options.method", "POST, PUT"),
        ({"headers": {"Authorization": "Bearer x"}}, "options.headers", "credential"),
        ({"headers": {"Idempotency-Key": "x"}}, "options.headers", "set by the target"),
        ({"headers": {"X-PM-Signature": "x"}}, "options.headers", "set by the target"),
        ({"headers": {"X-A": "a\r\nB: c"}}, "options.headers", "printable"),
        ({"headers": {f"X-{i}": "v" for i in range(21)}}, "options.headers", "at most 20"),
        ({"secret": "not a name"}, "options.secret", "PM_HTTP_SECRET_"),
        ({"retry": {"attempts": 0}}, "options.retry", "attempts"),
        ({"retry": {"attempts": 201}}, "options.retry", "attempts"),
        ({"retry": {"max_age": -1}}, "options.retry", "max_age"),
        ({"retry": {"backoff": {"initial": 5, "max": 1}}}, "options.retry", "backoff"),
        ({"retry": {"tries": 3}}, "options.retry", "attempts, max_age"),
        ({"timeout": 301}, "options.timeout", "at most 300"),
        ({"follow_redirects": "yes"}, "options.follow_redirects", "true or false"),
    ],
)
def test_refusals_name_the_field(options: dict[str, Any], field: str, words: str) -> None:
    found = problem(**options)
    assert found is not None and found[0] == field and words in found[1], found


def test_private_receivers_are_allowed_when_the_setting_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    local = {"url": "http://127.0.0.1:8080/"}
    with pytest.raises(ValueError, match="PM_HTTP_ALLOW_PRIVATE"):
        request_of(local, None, private_ok=False)  # the sending manager's own setting
    assert request_of(local, None, private_ok=True)["url"] == local["url"]
    monkeypatch.setenv("PM_HTTP_ALLOW_PRIVATE", "true")
    assert problem(url="http://127.0.0.1:8080/") is None


def test_a_url_is_required_unless_a_default_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    found = task_problem("t", "{}", {})
    assert found is not None and found.field == "options.url" and "PM_HTTP_URL" in found.reason
    monkeypatch.setenv("PM_HTTP_URL", URL)
    assert task_problem("t", "{}", {}) is None
    assert request_of({}, URL, private_ok=False)["url"] == URL


def test_retry_defaults_and_fractions() -> None:
    assert retry_of(None) == Retry(20, 86_400.0, 1.0, 600.0)
    got = retry_of({"attempts": 3, "max_age": 1.5, "backoff": {"initial": 0.05, "max": 0.2}})
    assert got == Retry(3, 1.5, 0.05, 0.2)


def test_the_core_lets_the_target_options_through_and_judges_them_with_the_target() -> None:
    options, _ = checked_options({"url": URL, "retry": {"attempts": 3}}, 65_536)
    deployment = TargetSet(("http", "outbox"))
    validate_task("t", "{}", options, deployment)  # http, the default: taken
    with pytest.raises(ConfigError) as bad:
        validate_task("t", "{}", {"url": "ftp://x"}, deployment)
    assert bad.value.field == "options.url"
    with pytest.raises(ConfigError) as foreign:
        validate_task("t", "{}", {**options, "target": "outbox"}, deployment)
    assert foreign.value.field == "options.url" and "only the http target" in str(foreign.value)
    with pytest.raises(ConfigError) as typo:
        checked_options({"urll": URL}, 65_536)
    assert typo.value.field == "options.urll" and "url" in str(typo.value)


def test_signature_round_trip_and_replay_window() -> None:
    header = sign(b"s3cret", 1_700_000_000, b'{"a":1}')
    assert header.startswith("t=1700000000,v1=")
    assert verify(b"s3cret", header, b'{"a":1}', now=1_700_000_100)
    assert not verify(b"s3cret", header, b'{"a":2}', now=1_700_000_100)
    assert not verify(b"other", header, b'{"a":1}', now=1_700_000_100)
    assert not verify(b"s3cret", header, b'{"a":1}', now=1_700_000_301)  # older than 5 min
