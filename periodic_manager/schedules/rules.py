"""The rules a schedule's payload and options follow, whoever wrote it: every option key with its
check, the limits of every number and JSON document, which targets a deployment runs
(:class:`TargetSet`, :func:`validate_target`), and what the schedule's target refuses in its task
whenever it is sent (:func:`validate_task`: the rules each target declares,
:mod:`periodic_manager.plugins.task_rules`).

Each check raises :class:`~periodic_manager.errors.ConfigError` naming the field and the reason.
The judge (:mod:`periodic_manager.schedules.judge`) asks them, with the rules of name, task type,
spec and zone, in one order, for every writer of a row: the API, import, the row judge of stored
rows and code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from periodic_manager.errors import ConfigError
from periodic_manager.plugins import installed, task_rules
from periodic_manager.schedules.bounds import check_instant, parse_instant
from periodic_manager.schedules.calendars import check_names
from periodic_manager.schedules.failures import MAX_FAILURES
from periodic_manager.schedules.runs import MAX_RUNS

QUEUE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}\Z")
DEFAULT_QUEUE = "default"
# skip: a slot more than grace late is skipped (default). fire_once: on start or takeover, the
# latest missed slot within the catch-up window is enqueued once. all: every missed slot within
# it, oldest first, paced (PM_CATCHUP_RATE; engine/catchup.py).
MISFIRE_POLICIES = ("skip", "fire_once", "all")
# What a slot does while the previous task of its schedule is still queued or running: allow
# (enqueue anyway, the default), skip (record it skipped) or hold (send it once that task has
# finished, within grace). skip and hold need a target that can tell "finished".
OVERLAP_POLICIES = ("allow", "skip", "hold")

# Bounds of every number a schedule holds. A duration is added to instants (slot + catch-up
# window, slot + expires, claim TTLs), so it must stay far inside datetime's range whatever the
# slot; a count is handed to workers. Checked by comparison, which is exact for ints of any size
# and false for NaN, so no value reaches float() or timedelta() unchecked.
MAX_DURATION_S = 366 * 86_400  # timeout, unique_ttl, catchup_window, extra.expires, ...
MAX_RETRY = 1_000
MAX_PRIORITY = 255  # AMQP priorities (Celery's extra.priority)
# JSON documents: nesting depth (the API refuses deeper bodies; serializers recurse) and the
# default size of payload and of options, counted as UTF-8 bytes of their canonical JSON.
MAX_JSON_DEPTH = 100
DEFAULT_MAX_PAYLOAD_BYTES = 65_536
TOO_LARGE = "too-large"  # ConfigError.code of a payload or options over the size limit

# One encoder for every canonical text (json.dumps would build a new one per call).
_ENCODE = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode


def canonical_json(value: Any) -> str:
    """Deterministic JSON text: sorted keys, no blanks, NaN/Infinity rejected."""
    return _ENCODE(value)


# The C parts of json.loads and of _ENCODE, made once: a cold start canonicalizes every
# payload it reads (a text PostgreSQL gave), and json.loads and JSONEncoder.encode spend more
# on their Python wrappers (a whitespace regex twice, an encoder built per call) than on the
# document. A parsed document holds no cycle: no circular check (markers None).
_SCAN = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[attr-defined]
_ENCODE_PARSED = (
    json.encoder.c_make_encoder(  # type: ignore[attr-defined]
        None, None, json.encoder.encode_basestring, None, ":", ",", True, False, False
    )
    if json.encoder.c_make_encoder is not None  # type: ignore[attr-defined]
    else None
)


class PendingJson:
    """A JSON document known to be valid and within every limit, not yet in canonical form."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def canonical_text(text: str) -> str:
    """``canonical_json(json.loads(text))`` of a valid JSON text, for less: the same text, and
    the same errors."""
    if _ENCODE_PARSED is None:  # no C accelerator (not CPython)
        return canonical_json(json.loads(text))
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:  # a blank first (a json column keeps the text as written)
        end = -1
    if end != len(text):  # blanks around, or not one document: json.loads decides
        value = json.loads(text)
    return "".join(_ENCODE_PARSED(value, 0))


def _check_queue(v: Any) -> None:
    if not isinstance(v, str) or not QUEUE_RE.match(v):
        raise ValueError(
            "must be 1-100 characters: an ASCII letter or digit, then ASCII letters, digits, "
            "'_', '.', ':' or '-'"
        )


def _check_int(v: Any, high: int, low: int = 0) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise ValueError(f"must be an integer from {low} to {high}")


def _check_count(v: Any) -> None:
    _check_int(v, MAX_RETRY)


def _check_seconds(v: Any) -> None:
    # ``0 < v <= MAX`` is false for NaN and infinities, and never converts a huge int.
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= MAX_DURATION_S:
        raise ValueError(f"must be a number of seconds > 0 and at most {MAX_DURATION_S} (366 days)")


def _check_misfire(v: Any) -> None:
    if v not in MISFIRE_POLICIES:
        raise ValueError(f"must be one of {', '.join(MISFIRE_POLICIES)}")


def _check_overlap(v: Any) -> None:
    if v not in OVERLAP_POLICIES:
        raise ValueError(f"must be one of {', '.join(OVERLAP_POLICIES)}")


def _check_word(v: Any) -> None:
    if not isinstance(v, str) or not 0 < len(v) <= 255:
        raise ValueError("must be a string of 1-255 characters")


# Keys of ``options.extra`` that targets read (targets/celery/message.py, targets/arq.py,
# targets/rq.py),
# checked like options so a bad value is refused when written instead of failing every enqueue.
# Other keys pass through unchecked.
EXTRA_CHECKS: dict[str, Callable[[Any], None]] = {
    "priority": lambda v: _check_int(v, MAX_PRIORITY),
    "expires": _check_seconds,
    "soft_time_limit": _check_seconds,
    "routing_key": _check_word,
    "exchange": _check_word,
}


def _check_extra(v: Any) -> None:
    if not isinstance(v, dict):
        raise ValueError("must be a JSON object")
    for key, check in EXTRA_CHECKS.items():
        if v.get(key) is not None:  # null: not set, as the targets read it
            try:
                check(v[key])
            except ValueError as exc:
                raise ConfigError(f"options.extra.{key}", str(exc)) from None


def _check_bool(v: Any) -> None:
    if not isinstance(v, bool):
        raise ValueError("must be true or false")


def _check_target(v: Any) -> None:
    # Any installed target (targets/registry.py); which of them a deployment runs is its
    # settings' business (see validate_target).
    if not isinstance(v, str) or v not in installed.names():
        raise ValueError(f"must be one of {', '.join(installed.names())}")


# Known option keys and their checks. Targets read what they need; anything else is rejected so a
# typo ("queu") is an error rather than a silently ignored setting.
OPTION_CHECKS: dict[str, Callable[[Any], None]] = {
    "queue": _check_queue,
    "max_retry": _check_count,
    "timeout": _check_seconds,
    "unique_ttl": _check_seconds,
    "misfire": _check_misfire,
    "catchup_window": _check_seconds,
    "overlap": _check_overlap,
    "overlap_timeout": _check_seconds,
    "extra": _check_extra,
    "target": _check_target,
    "start_at": check_instant,  # no slot before it (schedules/bounds.py)
    "end_at": check_instant,  # no slot at or after it
    # each slot sent at slot + [0, jitter) (schedules/jitter.py); under the shortest gap: the
    # judge asks jitter.check_gap once the schedule is known
    "jitter": _check_seconds,
    # no slot on a date of these calendars (schedules/calendars.py); each must exist: resolved
    # against pm_calendars by the provider and the API (db/calendars.py), else a row error
    "exclude": check_names,
    # at most that many scheduled slots sent (schedules/runs.py)
    "max_runs": lambda v: _check_int(v, MAX_RUNS, 1),
    # paused by the manager after that many failed tasks in a row (schedules/failures.py)
    "pause_after_failures": lambda v: _check_int(v, MAX_FAILURES, 1),
    # metric series of its own (runtime/schedule_series.py)
    "metrics": _check_bool,
}


def checked_options(options: Any, max_bytes: int) -> tuple[dict[str, Any], str]:
    """The options as a dict and their canonical JSON; ConfigError names the field."""
    if options is None:
        return {}, "{}"
    if not isinstance(options, Mapping):
        raise ConfigError("options", "must be a JSON object")
    options = dict(options)
    for key, value in options.items():
        check = OPTION_CHECKS.get(key)
        if check is None:
            if key in task_rules.target_options():
                continue  # a target's own option: its write-time rule judges it (validate_task)
            known = ", ".join(sorted([*OPTION_CHECKS, *task_rules.target_options()]))
            raise ConfigError(f"options.{key}", f"unknown option (known: {known})")
        try:
            check(value)
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(f"options.{key}", str(exc)) from None
    if "overlap_timeout" in options and overlap_policy(options) == "allow":
        raise ConfigError(
            "options.overlap_timeout", "only applies with options.overlap 'skip' or 'hold'"
        )
    if "start_at" in options and "end_at" in options:
        if not parse_instant(options["end_at"]) > parse_instant(options["start_at"]):
            raise ConfigError("options.end_at", "must be after options.start_at")
    text = check_json("options", options, max_bytes)
    return options, text


def check_json(field: str, value: Any, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Canonical JSON of ``value`` after the checks every JSON column gets, whoever wrote it:
    representable (no NaN, no non-JSON types), valid Unicode, no NUL characters (PostgreSQL
    cannot store them), nested at most MAX_JSON_DEPTH deep, at most ``max_bytes`` of UTF-8."""
    try:
        text = canonical_json(value)
    except RecursionError:
        raise ConfigError(field, f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(field, f"must be a JSON value: {exc}") from None
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:  # ensure_ascii=False leaves lone surrogates as they are
            raise ConfigError(field, "must be valid Unicode (unpaired surrogate)") from None
    if size > max_bytes:
        raise ConfigError(
            field,
            f"{size} bytes of JSON, more than the limit of {max_bytes} (PM_MAX_PAYLOAD_BYTES)",
            code=TOO_LARGE,
        )
    # Cheap tests on the text first (they hold for nearly every document): fewer containers
    # than the depth limit cannot nest deeper; no escape sequence, no NUL and no surrogate.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH or "\\u" in text:
        _walk_json(field, value)
    return text


def _walk_json(field: str, value: Any) -> None:
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            check_text(field, item)
        elif isinstance(item, dict | list):
            if depth >= MAX_JSON_DEPTH:
                raise ConfigError(field, f"nested deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(item, dict):
                for key, sub in item.items():
                    check_text(field, str(key))
                    stack.append((sub, depth + 1))
            else:
                stack.extend((sub, depth + 1) for sub in item)


def check_text(field: str, text: str) -> None:
    """Refuse what no backend stores as text: NUL characters and unpaired surrogates."""
    if "\x00" in text:
        raise ConfigError(field, "must not contain NUL characters")
    if text.isascii():  # no surrogate; the common case, without encoding
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(field, "must be valid Unicode (unpaired surrogate)") from None


def overlap_policy(options: Mapping[str, Any]) -> str:
    """The schedule's ``options.overlap`` (``allow`` when absent)."""
    return str(options.get("overlap", "allow"))


class TargetSet(tuple[str, ...]):
    """The targets a deployment runs, the default first, and for each one that cannot tell when
    a task has finished, why (``no_completion``): ``options.overlap`` skip and hold are refused
    there; and for each one that cannot tell a failed task, why (``no_failure``):
    ``options.pause_after_failures`` is refused there. Built by ``Settings.configured_targets()``;
    a plain tuple of names checks names only.
    """

    no_completion: dict[str, str]
    no_failure: dict[str, str]

    def __new__(
        cls,
        names: Collection[str],
        no_completion: Mapping[str, str] | None = None,
        no_failure: Mapping[str, str] | None = None,
    ) -> TargetSet:
        made = super().__new__(cls, names)
        made.no_completion = dict(no_completion or {})
        made.no_failure = dict(no_failure or {})
        return made


def validate_target(options: Mapping[str, Any], configured: Collection[str] | None) -> None:
    """Refuse a schedule whose ``options.target`` is not among the ``configured`` targets, or
    (when ``configured`` is a :class:`TargetSet`) whose ``options.overlap`` asks for skip or hold
    on a target without a completion signal, or whose ``options.pause_after_failures`` is set on
    a target that cannot tell a failed task.

    ``configured=None`` skips the check (code that builds configs without a deployment). The API
    (a 422 at write time) and the manager (a row error at sync time) both use this one check.
    """
    name = options.get("target")
    if configured is None:
        return
    if name is not None and name not in configured:
        raise ConfigError(
            "options.target",
            f"target {name!r} is not configured here (configured: {', '.join(configured)}; "
            "see PM_TARGET and PM_TARGETS)",
            code="unconfigured-target",
        )
    if not isinstance(configured, TargetSet) or not configured:
        return
    chosen = name if name is not None else next(iter(configured))
    if "pause_after_failures" in options and (why := configured.no_failure.get(chosen)):
        raise ConfigError(
            "options.pause_after_failures", failure_refusal(chosen, why), code=NO_FAILURE
        )
    policy = overlap_policy(options)
    if policy == "allow":
        return
    why = configured.no_completion.get(chosen)
    if why is not None:
        raise ConfigError(
            "options.overlap",
            f"{policy!r} needs to know when the previous task has finished, and the {chosen} "
            f"target cannot tell here: {why}",
            code="no-completion-signal",
        )


def validate_task(
    task_type: str,
    payload_json: str,
    options: Mapping[str, Any],
    configured: Collection[str] | None,
) -> None:
    """Refuse a task the schedule's target (``options.target``, else the default: the first of
    ``configured``) refuses whenever it is sent: the rule that target declares
    (:mod:`periodic_manager.plugins.task_rules`). ConfigError names the field the target names
    (``task_type``, ``payload``, ``options.queue``) and the target, code ``target-refuses``.

    Checked, like :func:`validate_target`, only when ``configured`` is a :class:`TargetSet` (a
    deployment), after it: ``options.target`` is one of them. ``payload_json``: the payload's
    JSON text (canonical or as stored).
    """
    if not isinstance(configured, TargetSet) or not configured:
        return
    name = options.get("target")
    chosen = name if isinstance(name, str) else next(iter(configured))
    refuse_foreign_options(options, chosen, configured)
    rule = task_rules.rule_of(chosen)
    if rule is not None and (problem := rule(task_type, payload_json, options)) is not None:
        raise target_refusal(chosen, problem)


def refuse_foreign_options(
    options: Mapping[str, Any], target: str, configured: Collection[str]
) -> None:
    """Refuse an option that a target of the deployment (``configured``) declares, on a
    schedule of another target (``options.url`` of the http target on one sent to Redis):
    nothing would read it. (Where no configured target declares it, the key is no typo, and
    nothing reads it either: it is let through, as a row of another deployment.)"""
    declared = task_rules.target_options()
    for key in options:
        if key in declared and target not in declared[key] and set(declared[key]) & set(configured):
            raise ConfigError(
                f"options.{key}",
                f"only the {', '.join(declared[key])} target reads it, and this schedule's "
                f"target is {target}",
                code=TARGET_REFUSES,
            )


def target_refusal(target: str, problem: task_rules.TaskProblem) -> ConfigError:
    """The error of a task ``target`` refuses (:func:`validate_task`, the row judge)."""
    return ConfigError(
        problem.field, f"the {target} target refuses it: {problem.reason}", code=TARGET_REFUSES
    )


TARGET_REFUSES = "target-refuses"  # ConfigError.code of a task its target would always refuse
NO_FAILURE = "no-failure-signal"  # ConfigError.code of pause_after_failures where it cannot work


def failure_refusal(target: str, why: str) -> str:
    """The reason ``options.pause_after_failures`` is refused on ``target`` (API, rows, code)."""
    return f"needs to know whether a task failed, and the {target} target cannot tell a failed task: {why}"
