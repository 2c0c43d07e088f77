"""A schedule as the manager sees it: :class:`PeriodicTaskConfig`, its content hash, and the text
of its slots and idempotency keys.

Rows are untrusted input, so :meth:`PeriodicTaskConfig.create` checks every field by the rules of
:mod:`periodic_manager.schedules.rules` and raises :class:`~periodic_manager.errors.ConfigError`
naming the field and the reason. The content hash covers exactly what decides slots and messages:
spec, timezone, anchor, task type, canonical JSON of payload and of options. Name and row id are
identity, not content.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any

from periodic_manager import cron
from periodic_manager.schedules.calendars import Exclusion
from periodic_manager.schedules.instants import slot_text
from periodic_manager.schedules.judge import Deployment, Judge, Judged
from periodic_manager.schedules.rules import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_QUEUE,
    PendingJson,
    canonical_json,
    canonical_text,
)

# ``effective_at`` of a row whose value is missing or unreadable: the start is unknown, so nothing
# in the past may be sent (a look back stops at now).
UNKNOWN_START = datetime.max.replace(tzinfo=cron.UTC)

_EMPTY_OPTIONS: Mapping[str, Any] = MappingProxyType({})


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
        # options.exclude resolved against the calendars (schedules/calendars.py): set by whoever
        # read the calendars (the provider, the API); None: no options.exclude, or not resolved.
        "exclusion",
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
            name,
            spec,
            task_type,
            options,
            options_json,
            timezone,
            anchor,
            schedule_id,
            effective_at,
            payload_json if payload_json is not None else canonical_json(payload),
            revision,
        )

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
        self.exclusion: Exclusion | None = None

    @classmethod
    def of_row(cls, *fields: Any) -> PeriodicTaskConfig:
        """A config from values a judge has already checked, in :meth:`_fill`'s order (no
        validation, no keywords: a provider builds a million of these)."""
        config = cls.__new__(cls)
        config._fill(*fields)
        config._fresh()
        return config

    @classmethod
    def of_judged(
        cls,
        judged: Judged,
        schedule_id: int | str | None = None,
        effective_at: datetime | None = None,
        revision: int | None = None,
    ) -> PeriodicTaskConfig:
        """The config of a row the judge (:mod:`periodic_manager.schedules.judge`) accepted."""
        j = judged
        config = cls.of_row(
            j.name,
            j.spec,
            j.task_type,
            j.options,
            j.options_json,
            j.timezone,
            j.anchor,
            schedule_id,
            effective_at,
            j.payload,
            revision,
        )
        config.exclusion = j.exclusion
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
        timezone: str = "UTC",
        anchor: datetime | None = None,
        payload: Any = None,
        options: Mapping[str, Any] | None = None,
        allowed_targets: Collection[str] | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        schedule_id: int | str | None = None,
        effective_at: datetime | None = None,
        revision: int | None = None,
    ) -> PeriodicTaskConfig:
        """Judge every field (:mod:`periodic_manager.schedules.judge`) and return the config;
        raises ConfigError naming the judge's first problem.

        ``allowed_targets``: the targets this deployment runs; ``options.target`` must name one
        of them (None: any known target is accepted), and, when it is a
        :class:`~periodic_manager.schedules.rules.TargetSet`, the schedule's target must take
        the task (:func:`~periodic_manager.schedules.rules.validate_task`).
        ``max_payload_bytes`` bounds the canonical JSON of payload and of options each
        (ConfigError code ``too-large`` beyond it).
        """
        fields = {
            "name": name,
            "spec": spec,
            "task_type": task_type,
            "payload": payload,
            "options": {} if options is None else options,
            "timezone": timezone,
            "anchor": anchor,
        }
        verdict = Judge(Deployment(max_payload_bytes, allowed_targets))(fields)
        if isinstance(verdict, list):
            raise verdict[0].error()
        return cls.of_judged(verdict, schedule_id, effective_at, revision)

    @property
    def payload_json(self) -> str:
        """Canonical JSON of the payload."""
        text = self._payload
        if type(text) is not str:
            # A document already proven valid and within every limit (PendingJson): its
            # canonical form is made when first needed (staging, hashing), not on a cold start.
            text = self._payload = canonical_text(text.text)  # type: ignore[union-attr]
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
        ex = self.exclusion
        return (
            self.name,
            self.spec,
            self.task_type,
            self.payload_json,
            self.options_json,
            self.timezone,
            self.anchor,
            self.schedule_id,
            ex.digest if ex is not None else None,
        )

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
    """sha256 over spec, timezone, anchor, task type, canonical payload and canonical options,
    and the content of the calendars ``options.exclude`` names when resolved (computed on each call: it is needed when a row changed or an entry is published, not per
    slot, and storing it would cost every schedule 100 bytes)."""
    anchor = cfg.anchor
    # Separated by a unit separator no field can hold (spec and task type are printable, the
    # JSON texts escape control characters): unambiguous, and cheaper than encoding a list. One
    # f-string (no tuple, no join): a cold start hashes every entry to publish it.
    doc = (
        f"{cfg.spec}\x1f{cfg.timezone}\x1f"
        f"{'-' if anchor is None else anchor.astimezone(cron.UTC).isoformat()}\x1f"
        f"{cfg.task_type}\x1f{cfg.payload_json}\x1f{cfg.options_json}"
    )
    if cfg.exclusion is not None:  # a calendar edit replaces exactly the entries that name it
        doc += "\x1f" + cfg.exclusion.digest
    return hashlib.sha256(doc.encode()).hexdigest()


def idempotency_key(name: str, slot: datetime) -> str:
    """``<name>:<slot as UTC ISO instant>``, e.g. ``reports.daily:2024-03-31T01:30:00Z``."""
    return f"{name}:{slot_text(slot)}"
