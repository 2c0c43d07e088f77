"""A schedule as the manager sees it: :class:`PeriodicTaskConfig`, its validation and its hash.

Rows are untrusted input, so :func:`validate_config` checks every field and raises
:class:`~periodic_manager.errors.ConfigError` naming the field and the reason. The content hash
covers exactly what decides slots and messages: spec, timezone, anchor, task type, canonical JSON
of payload and of options. Name and row id are identity, not content.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any

from periodic_manager import cron
from periodic_manager.errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,199}\Z")
QUEUE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}\Z")
TASK_TYPE_MAX = 200
SPEC_MAX = 200  # the periodic_jobs.spec column
DEFAULT_QUEUE = "default"
# Every target a schedule may name in ``options.target``; which of them a deployment runs is its
# settings' business (see validate_target).
TARGET_NAMES = ("redis", "outbox", "celery", "arq")
# skip: a slot more than grace late is skipped (default). fire_once: on start or takeover, the
# latest missed slot within the catch-up window is enqueued once.
MISFIRE_POLICIES = ("skip", "fire_once")
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
MAX_EVERY_DAYS = 36_500  # @every at most ~100 years: its next slot is at most that far ahead
MAX_EVERY_US = MAX_EVERY_DAYS * 86_400 * 1_000_000
# JSON documents: nesting depth (the API refuses deeper bodies; serializers recurse) and the
# default size of payload and of options, counted as UTF-8 bytes of their canonical JSON.
MAX_JSON_DEPTH = 100
DEFAULT_MAX_PAYLOAD_BYTES = 65_536
TOO_LARGE = "too-large"  # ConfigError.code of a payload or options over the size limit

# One encoder for every canonical text (json.dumps would build a new one per call).
_ENCODE = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode

# ``effective_at`` of a row whose value is missing or unreadable: the start is unknown, so nothing
# in the past may be sent (a look back stops at now).
UNKNOWN_START = datetime.max.replace(tzinfo=cron.UTC)


def canonical_json(value: Any) -> str:
    """Deterministic JSON text: sorted keys, no blanks, NaN/Infinity rejected."""
    return _ENCODE(value)


def _check_queue(v: Any) -> None:
    if not isinstance(v, str) or not QUEUE_RE.match(v):
        raise ValueError(
            "must be 1-100 characters: an ASCII letter or digit, then ASCII letters, digits, "
            "'_', '.', ':' or '-'"
        )


def _check_int(v: Any, high: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= high:
        raise ValueError(f"must be an integer from 0 to {high}")


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


# Keys of ``options.extra`` that targets read (targets/celery.py, targets/arq.py), checked like
# options so a bad value is refused when written instead of failing every enqueue. Other keys
# pass through unchecked.
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


def _check_target(v: Any) -> None:
    if not isinstance(v, str) or v not in TARGET_NAMES:
        raise ValueError(f"must be one of {', '.join(TARGET_NAMES)}")


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
}


def validate_options(options: Any) -> dict[str, Any]:
    """Return ``options`` as a dict, or raise ConfigError naming ``options.<key>``."""
    return _options(options, DEFAULT_MAX_PAYLOAD_BYTES)[0]


def _options(options: Any, max_bytes: int) -> tuple[dict[str, Any], str]:
    """The options as a dict and their canonical JSON; ConfigError names the field."""
    if options is None:
        return {}, "{}"
    if not isinstance(options, Mapping):
        raise ConfigError("options", "must be a JSON object")
    options = dict(options)
    for key, value in options.items():
        check = OPTION_CHECKS.get(key)
        if check is None:
            known = ", ".join(sorted(OPTION_CHECKS))
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
    there. Built by ``Settings.configured_targets()``; a plain tuple of names checks names only.
    """

    no_completion: dict[str, str]

    def __new__(
        cls, names: Collection[str], no_completion: Mapping[str, str] | None = None
    ) -> TargetSet:
        made = super().__new__(cls, names)
        made.no_completion = dict(no_completion or {})
        return made


def validate_target(options: Mapping[str, Any], configured: Collection[str] | None) -> None:
    """Refuse a schedule whose ``options.target`` is not among the ``configured`` targets, or
    (when ``configured`` is a :class:`TargetSet`) whose ``options.overlap`` asks for skip or hold
    on a target without a completion signal.

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
    policy = overlap_policy(options)
    if policy == "allow" or not isinstance(configured, TargetSet) or not configured:
        return
    chosen = name if name is not None else next(iter(configured))
    why = configured.no_completion.get(chosen)
    if why is not None:
        raise ConfigError(
            "options.overlap",
            f"{policy!r} needs to know when the previous task has finished, and the {chosen} "
            f"target cannot tell here: {why}",
            code="no-completion-signal",
        )


def validate_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(
            "name",
            "must be 1-200 characters: an ASCII letter or digit, then ASCII letters, digits, "
            "'_', '.', ':', '/', '@' or '-'",
        )
    return name


def validate_task_type(task_type: Any) -> str:
    if not isinstance(task_type, str) or not task_type.strip():
        raise ConfigError("task_type", "must be a non-empty string")
    if len(task_type) > TASK_TYPE_MAX or not task_type.isprintable():
        raise ConfigError("task_type", f"must be at most {TASK_TYPE_MAX} printable characters")
    return task_type


def validate_payload(payload: Any, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Return the payload's canonical JSON, or raise ConfigError naming ``payload``."""
    return check_json("payload", payload, max_bytes)


def validate_schedule(spec: Any, timezone: Any, anchor: datetime | None) -> cron.Schedule:
    """Parse (spec, timezone, anchor); ConfigError names ``spec``, ``timezone`` or ``anchor``."""
    if not isinstance(spec, str):
        raise ConfigError("spec", "must be a string")
    if len(spec) > SPEC_MAX:
        raise ConfigError("spec", f"must be at most {SPEC_MAX} characters")
    if not isinstance(timezone, str) or not timezone:
        raise ConfigError("timezone", "must be an IANA zone name such as 'UTC' or 'Europe/Berlin'")
    check_text("timezone", timezone)  # a zone name becomes a file path
    if anchor is not None and (
        not isinstance(anchor, datetime) or anchor.tzinfo is None or anchor.utcoffset() is None
    ):
        raise ConfigError("anchor", "must be an instant with a UTC offset")
    try:
        schedule = cron.parse(spec, tz=timezone, anchor=anchor)
    except cron.CronError as exc:
        if exc.field in ("timezone", "anchor"):
            raise ConfigError(exc.field, exc.reason, code=exc.code) from None
        raise ConfigError("spec", str(exc), code=exc.code) from None
    if isinstance(schedule, cron.EverySchedule) and schedule.spec.period_us > MAX_EVERY_US:
        raise ConfigError(
            "spec",
            f"every-duration: an @every interval may be at most {MAX_EVERY_DAYS}d",
            code="every-duration",
        )
    return schedule


_EMPTY_OPTIONS: Mapping[str, Any] = MappingProxyType({})


class PendingJson:
    """A JSON document known to be valid and within every limit, not yet in canonical form."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class PeriodicTaskConfig:
    """One schedule: what to enqueue (task type, payload, options) and when (spec, zone, anchor).

    ``schedule_id`` is the row id (None for schedules made in code); ``name`` is the human key
    used in idempotency keys. Build through :meth:`create` to validate.

    Lean by design (a manager holds a million of these): the payload is kept only as its
    canonical JSON text (``payload`` parses it on demand), empty options are one shared mapping,
    and the content hash is computed when asked for, never stored. Treat instances as immutable.
    """

    __slots__ = (
        "name",
        "spec",
        "task_type",
        "options",
        "timezone",
        "anchor",
        "schedule_id",
        "effective_at",
        "revision",
        "_payload",
        "_options_json",
    )

    def __init__(
        self,
        name: str,
        spec: str,
        task_type: str,
        payload: Any = None,
        options: Mapping[str, Any] | None = None,
        timezone: str = "UTC",
        anchor: datetime | None = None,
        schedule_id: int | str | None = None,
        effective_at: datetime | None = None,
        *,
        payload_json: str | PendingJson | None = None,
        options_json: str | None = None,
        revision: int | None = None,
    ) -> None:
        self._fill(
            name, spec, task_type, options, options_json, timezone, anchor, schedule_id,
            effective_at, payload_json if payload_json is not None else canonical_json(payload),
            revision,
        )  # fmt: skip

    def _fill(
        self,
        name: str,
        spec: str,
        task_type: str,
        options: Mapping[str, Any] | None,
        options_json: str | None,
        timezone: str,
        anchor: datetime | None,
        schedule_id: int | str | None,
        effective_at: datetime | None,
        payload: str | PendingJson,
        revision: int | None,
    ) -> None:
        self.name = name
        self.spec = spec
        self.task_type = task_type
        # Canonical JSON of the payload, the form hashed and sent, or a PendingJson whose
        # canonical form is made on first use (see payload_json).
        self._payload = payload
        self.options = options if options else _EMPTY_OPTIONS
        self._options_json = options_json if options else "{}"
        self.timezone = timezone
        self.anchor = anchor
        self.schedule_id = schedule_id
        # No slot at or before this instant is sent (the row's ``effective_at``); None: no such
        # bound (a schedule made in code). Not content: it bounds how far back a manager may look.
        self.effective_at = effective_at
        # The row's revision when read (None: not from a row): an unchanged revision means an
        # unchanged row, so a sync reuses this config without reading the row again.
        self.revision = revision

    @classmethod
    def of_row(
        cls,
        name: str,
        spec: str,
        task_type: str,
        options: Mapping[str, Any],
        options_json: str,
        timezone: str,
        anchor: datetime | None,
        schedule_id: int | str | None,
        effective_at: datetime | None,
        payload: str | PendingJson,
        revision: int | None,
    ) -> PeriodicTaskConfig:
        """A config from values a judge has already checked (no validation, no keywords: a
        provider builds a million of these)."""
        config = cls.__new__(cls)
        config._fill(
            name, spec, task_type, options, options_json, timezone, anchor, schedule_id,
            effective_at, payload, revision,
        )  # fmt: skip
        config._fresh()
        return config

    def _fresh(self) -> None:
        """Hook for subclasses built by a provider (see ScheduledEntry)."""

    @classmethod
    def create(
        cls,
        *,
        name: str,
        spec: str,
        task_type: str,
        payload: Any = None,
        options: Mapping[str, Any] | None = None,
        timezone: str = "UTC",
        anchor: datetime | None = None,
        schedule_id: int | str | None = None,
        allowed_targets: Collection[str] | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        effective_at: datetime | None = None,
        revision: int | None = None,
    ) -> PeriodicTaskConfig:
        """Validate every field and return the config; raises ConfigError.

        ``allowed_targets``: the targets this deployment runs; ``options.target`` must name one
        of them (None: any known target is accepted). ``max_payload_bytes`` bounds the canonical
        JSON of payload and of options each (ConfigError code ``too-large`` beyond it).
        """
        validate_name(name)
        validate_task_type(task_type)
        payload_json = validate_payload(payload, max_payload_bytes)
        opts, options_json = _options(options, max_payload_bytes)
        validate_target(opts, allowed_targets)
        validate_schedule(spec, timezone, anchor)
        return cls(
            name,
            spec,
            task_type,
            options=opts,
            timezone=timezone,
            anchor=anchor,
            schedule_id=schedule_id,
            effective_at=effective_at,
            payload_json=payload_json,
            options_json=options_json,
            revision=revision,
        )

    @property
    def payload_json(self) -> str:
        """Canonical JSON of the payload."""
        text = self._payload
        if type(text) is not str:
            # A document already proven valid and within every limit (PendingJson): its
            # canonical form is made when first needed (staging, hashing), not on a cold start.
            text = self._payload = canonical_json(json.loads(text.text))  # type: ignore[union-attr]
        return text

    @property
    def payload(self) -> Any:
        """The payload as a Python value (parsed from its JSON on each access)."""
        return json.loads(self.payload_json)

    @property
    def options_json(self) -> str:
        """Canonical JSON of the options."""
        text = self._options_json
        if text is None:
            text = self._options_json = canonical_json(dict(self.options))
        return text

    @property
    def queue(self) -> str:
        return str(self.options.get("queue", DEFAULT_QUEUE))

    @property
    def schedule(self) -> cron.Schedule:
        """The parsed schedule (shared between identical (spec, zone, anchor) triples)."""
        return cron.parse(self.spec, tz=self.timezone, anchor=self.anchor)

    @property
    def content_hash(self) -> str:
        return content_hash(self)

    @property
    def key(self) -> str:
        """Identity of the entry's source: the row id, or the name for code-made schedules."""
        return str(self.schedule_id) if self.schedule_id is not None else f"name:{self.name}"

    @property
    def ident(self) -> int | str:
        """The key as the scheduler files it: the row id as an int (no string per schedule), or
        ``name:<name>`` for code-made schedules (see :func:`ident_of`)."""
        sid = self.schedule_id
        if type(sid) is int:
            return sid
        return ident_of(self.key)

    def _content(self) -> tuple[Any, ...]:
        return (self.name, self.spec, self.task_type, self.payload_json, self.options_json,
                self.timezone, self.anchor, self.schedule_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PeriodicTaskConfig):
            return NotImplemented
        return self._content() == other._content()

    __hash__ = None  # type: ignore[assignment]  # equal by value, and mutable in principle

    def __repr__(self) -> str:
        return (
            f"PeriodicTaskConfig(name={self.name!r}, spec={self.spec!r}, task_type={self.task_type!r},"
            f" payload={self.payload_json}, options={self.options_json}, timezone={self.timezone!r},"
            f" anchor={self.anchor!r}, schedule_id={self.schedule_id!r})"
        )


def ident_of(key: str) -> int | str:
    """A schedule key (``"42"``, ``"name:x"``) as the scheduler files it: decimal keys as ints."""
    return int(key) if key.isdigit() and key.isascii() else key


def content_hash(cfg: PeriodicTaskConfig) -> str:
    """sha256 over spec, timezone, anchor, task type, canonical payload and canonical options
    (computed on each call: it is needed when a row changed or an entry is published, not per
    slot, and storing it would cost every schedule 100 bytes)."""
    anchor = cfg.anchor.astimezone(cron.UTC).isoformat() if cfg.anchor is not None else "-"
    # Joined with a unit separator no field can hold (spec and task type are printable, the JSON
    # texts escape control characters): unambiguous, and cheaper than encoding a list.
    doc = "\x1f".join(
        (cfg.spec, cfg.timezone, anchor, cfg.task_type, cfg.payload_json, cfg.options_json)
    )
    return hashlib.sha256(doc.encode()).hexdigest()


def entry_id(cfg: PeriodicTaskConfig, digest: str | None = None) -> str:
    """Stable entry id derived from the row and the content hash (the same across restarts)."""
    return f"{cfg.key}-{(digest or content_hash(cfg))[:12]}"


def slot_text(slot: datetime) -> str:
    """An instant as UTC ISO text with ``Z``: ``2024-03-31T01:30:00Z`` (microseconds if any).

    The one format of every instant in keys and messages. A naive datetime is refused.
    """
    if slot.tzinfo is None or slot.utcoffset() is None:
        raise ValueError(f"naive datetime {slot!r}; pass an aware instant")
    utc = slot.astimezone(cron.UTC)
    text = utc.isoformat(timespec="microseconds" if utc.microsecond else "seconds")
    return text.replace("+00:00", "Z")


def idempotency_key(name: str, slot: datetime) -> str:
    """``<name>:<slot as UTC ISO instant>``, e.g. ``reports.daily:2024-03-31T01:30:00Z``."""
    return f"{name}:{slot_text(slot)}"
