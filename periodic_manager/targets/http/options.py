"""What a schedule of the http target may ask, and its write-time rule (:func:`task_problem`).

``options.url`` (http or https; default ``PM_HTTP_URL``), ``options.method`` (``POST``, the
default, or ``PUT``), ``options.headers`` (an object of at most 20 plain headers: no
credentials, which go by reference, and none of the headers the target sets itself),
``options.secret`` (the NAME of ``PM_HTTP_SECRET_<NAME>``), ``options.retry``
(``{"attempts": 1..200, "max_age": s, "backoff": {"initial": s, "max": s}}``, fractions of a
second allowed), ``options.timeout`` (seconds a request may take, at most 300; default 10) and
``options.follow_redirects`` (false by default).

The rule is asked by the one judge (API, import, stored rows). It reads ``PM_HTTP_URL`` and
``PM_HTTP_ALLOW_PRIVATE`` from the process environment (a rule is given no settings); the
deliverer applies the settings' values again when it sends.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from periodic_manager.plugins.task_rules import TaskProblem
from periodic_manager.targets.http.addresses import literal_refusal

# The option keys the http target reads besides the core's (``timeout``): declared by its plugin.
OPTION_KEYS = ("url", "method", "headers", "secret", "retry", "follow_redirects")
METHODS = ("POST", "PUT")
MAX_URL = 2048
MAX_HEADERS = 20
MAX_HEADER_VALUE = 1000
MAX_TIMEOUT_S = 300.0
DEFAULT_TIMEOUT_S = 10.0
MAX_ATTEMPTS = 200
MAX_AGE_S = 366 * 86_400.0
SECRET_RE = re.compile(r"^[A-Za-z0-9_]{1,64}\Z")
HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}\Z")
# Set by the target itself, or credentials (which go by reference: options.secret).
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "idempotency-key",
        "authorization",
        "proxy-authorization",
        "cookie",
    }
)


@dataclass(frozen=True, slots=True)
class Retry:
    """A delivery's retry policy: at most ``attempts`` requests, none after ``max_age`` seconds
    from its first, waits from ``initial`` doubling up to ``max`` seconds (with jitter)."""

    attempts: int = 20
    max_age: float = 86_400.0
    initial: float = 1.0
    max: float = 600.0


DEFAULT_RETRY = Retry()


def _seconds(v: Any, high: float) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and 0 < v <= high


def _url_problem(v: Any, *, private_ok: bool | None = None) -> str | None:
    if not isinstance(v, str) or not 0 < len(v) <= MAX_URL:
        return f"must be a URL of at most {MAX_URL} characters"
    try:
        parts = urlsplit(v)
        port = parts.port
    except ValueError as exc:
        return f"is no URL: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return "must not hold credentials (sign with options.secret instead)"
    if port == 0 or any(c in v for c in "\r\n\t "):
        return "must be a valid URL (no blanks, a port from 1 to 65535)"
    if not (allow_private() if private_ok is None else private_ok):
        why = literal_refusal(parts.hostname)
        if why is not None:
            return f"{why}: refused to protect the manager's network (PM_HTTP_ALLOW_PRIVATE)"
    return None


URL_CHECKED = "https://checked.invalid/"  # stands for a URL judged already (request_of)


def _method_problem(v: Any) -> str | None:
    return None if v in METHODS else f"must be one of {', '.join(METHODS)}"


def _headers_problem(v: Any) -> str | None:
    if not isinstance(v, dict) or len(v) > MAX_HEADERS:
        return f"must be an object of at most {MAX_HEADERS} headers"
    for name, value in v.items():
        if not HEADER_NAME_RE.match(name):
            return f"{name!r} is no header name"
        low = name.lower()
        if low in RESERVED_HEADERS or low.startswith("x-pm-"):
            return f"{name!r} is set by the target, or a credential (use options.secret)"
        if not isinstance(value, str) or len(value) > MAX_HEADER_VALUE:
            return f"{name}: must be a string of at most {MAX_HEADER_VALUE} characters"
        if any(ord(c) < 32 or ord(c) == 127 for c in value) or not value.isascii():
            return f"{name}: must be printable ASCII"
    return None


def _secret_problem(v: Any) -> str | None:
    if isinstance(v, str) and SECRET_RE.match(v):
        return None
    return "must be the NAME of a PM_HTTP_SECRET_<NAME> variable: 1-64 letters, digits or '_'"


def _retry_problem(v: Any) -> str | None:
    try:
        retry_of(v)
    except ValueError as exc:
        return str(exc)
    return None


def _redirects_problem(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


def _timeout_problem(v: Any) -> str | None:
    return None if _seconds(v, MAX_TIMEOUT_S) else f"must be seconds > 0, at most {MAX_TIMEOUT_S:g}"


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "url": _url_problem,
    "method": _method_problem,
    "headers": _headers_problem,
    "secret": _secret_problem,
    "retry": _retry_problem,
    "follow_redirects": _redirects_problem,
    "timeout": _timeout_problem,
}


def retry_of(v: Any) -> Retry:
    """The policy ``options.retry`` asks (ValueError naming the key at fault)."""
    if v is None:
        return DEFAULT_RETRY
    if not isinstance(v, dict) or set(v) - {"attempts", "max_age", "backoff"}:
        return _bad("must be an object with attempts, max_age and backoff")
    attempts = v.get("attempts", DEFAULT_RETRY.attempts)
    if isinstance(attempts, bool) or not isinstance(attempts, int):
        return _bad(f"attempts: must be an integer from 1 to {MAX_ATTEMPTS}")
    if not 1 <= attempts <= MAX_ATTEMPTS:
        return _bad(f"attempts: must be an integer from 1 to {MAX_ATTEMPTS}")
    max_age = v.get("max_age", DEFAULT_RETRY.max_age)
    if not _seconds(max_age, MAX_AGE_S):
        return _bad(f"max_age: must be seconds > 0, at most {MAX_AGE_S:g}")
    backoff = v.get("backoff", {})
    if not isinstance(backoff, dict) or set(backoff) - {"initial", "max"}:
        return _bad("backoff: must be an object with initial and max")
    initial = backoff.get("initial", DEFAULT_RETRY.initial)
    high = backoff.get("max", max(DEFAULT_RETRY.max, initial) if _seconds(initial, 1e9) else 0)
    if not _seconds(initial, MAX_AGE_S) or not _seconds(high, MAX_AGE_S) or high < initial:
        return _bad("backoff: initial and max must be seconds > 0, max at least initial")
    return Retry(attempts, float(max_age), float(initial), float(high))


def _bad(reason: str) -> Retry:
    raise ValueError(reason)


def allow_private(environ: Mapping[str, str] | None = None) -> bool:
    """``PM_HTTP_ALLOW_PRIVATE`` as the settings read it (true, 1, yes, on)."""
    value = (os.environ if environ is None else environ).get("PM_HTTP_ALLOW_PRIVATE", "")
    return value.strip().lower() in ("true", "1", "yes", "on")


def default_url(environ: Mapping[str, str] | None = None) -> str | None:
    """``PM_HTTP_URL`` (None: unset or blank)."""
    value = (os.environ if environ is None else environ).get("PM_HTTP_URL", "").strip()
    return value or None


def task_problem(
    task_type: str, payload_json: str, options: Mapping[str, Any]
) -> TaskProblem | None:
    """The http target's write-time rule (see the module doc)."""
    for key, check in _CHECKS.items():
        if key in options and (why := check(options[key])) is not None:
            return TaskProblem(f"options.{key}", why)
    if "url" not in options and default_url() is None:
        return TaskProblem("options.url", "required: no default URL is set (PM_HTTP_URL)")
    return None


def request_of(options: Mapping[str, Any], url: str | None, *, private_ok: bool) -> dict[str, Any]:
    """What a delivery stores of its schedule's options: the request and its policy, resolved
    (``url``: the default when the options name none; ``private_ok``: the sending manager's
    ``PM_HTTP_ALLOW_PRIVATE``). ValueError: options the rule refuses."""
    resolved = {**options, "url": options.get("url", url)}
    if (why := _url_problem(resolved["url"], private_ok=private_ok)) is not None:
        raise ValueError(f"options.url: {why}")
    if (problem := task_problem("", "", {**resolved, "url": URL_CHECKED})) is not None:
        raise ValueError(f"{problem.field}: {problem.reason}")
    timeout = options.get("timeout", DEFAULT_TIMEOUT_S)
    return {
        "url": options.get("url", url),
        "method": options.get("method", "POST"),
        "headers": dict(options.get("headers", {})),
        "secret": options.get("secret"),
        "timeout": float(timeout) if math.isfinite(timeout) else DEFAULT_TIMEOUT_S,
        "follow_redirects": bool(options.get("follow_redirects", False)),
        "retry": asdict(retry_of(options.get("retry"))),
    }
