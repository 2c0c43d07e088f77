"""A ``periodic_jobs`` row as people see it (the API, the dashboard, the export): every column
decoded, and the judge's verdict on it (:mod:`periodic_manager.db.judge`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from periodic_manager.contracts import RowError
from periodic_manager.db.judge import Rules, judge_content, raw_hash
from periodic_manager.db.rows import FIELDS, decode
from periodic_manager.errors import ConfigError
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.rules import canonical_json, check_json


@dataclass(slots=True)
class RowView:
    """A row decoded for display. ``values`` holds every column of :data:`FIELDS` but the id,
    None where the column cannot be read (``options``: {} then); ``errors`` says why, the
    judge's verdict first. ``config`` is the usable config, or None."""

    id: int
    values: dict[str, Any]
    errors: list[tuple[str, str]]
    config: PeriodicTaskConfig | None
    unreadable: dict[str, str] = field(default_factory=dict)  # column -> why it reads as None
    raw: tuple[Any, ...] = ()

    @property
    def enabled(self) -> bool | None:
        return self.values["enabled"]

    @property
    def usable(self) -> bool:
        """Whether a manager would schedule the row were it enabled: its content is a config
        and its ``enabled`` is true or false."""
        return self.config is not None and "enabled" not in self.unreadable

    @property
    def etag(self) -> str:
        """A strong validator of this version: the hash of every raw column."""
        return '"' + raw_hash(self.raw)[:32] + '"'


def view(rules: Rules, raw: Sequence[Any]) -> RowView:
    """The row as the API and the export show it, judged exactly as the manager judges it.

    ``errors`` lists, in this order: a bad ``enabled``; the content's verdict (what a manager
    reports for the row when it is enabled; paused rows are judged too, since resuming them
    needs it); then each further column that cannot be read (shown as None). Only the first two
    kinds make a row unusable; a bad ``description`` or timestamp does not.
    """
    raw = tuple(raw)
    values: dict[str, Any] = {}
    unreadable: dict[str, str] = {}
    for name, value in zip(FIELDS[1:], raw[1:], strict=False):
        try:
            values[name] = decode(rules.sqlite, name, value)
        except ConfigError as exc:
            values[name] = None
            if name != "effective_at":  # unknown, not an error (see effective_at())
                unreadable[name] = exc.reason
    verdict = judge_content(rules, raw)
    config = verdict if isinstance(verdict, PeriodicTaskConfig) else None
    if config is not None:
        # The judge's own values: options normalised (JSON null reads as {}), JSON checked.
        values["payload"], values["options"] = config.payload, dict(config.options)
    else:
        _safe_json(rules, values, unreadable)
    errors: dict[str, str] = {}  # field -> reason, in insertion order, one item per field
    if "enabled" in unreadable:
        errors["enabled"] = unreadable["enabled"]
    if isinstance(verdict, RowError):
        errors.setdefault(verdict.field, verdict.reason)
    for name, reason in unreadable.items():
        errors.setdefault(name, reason)
    return RowView(raw[0], values, list(errors.items()), config, unreadable, raw)


def _safe_json(rules: Rules, values: dict[str, Any], unreadable: dict[str, str]) -> None:
    """Show a JSON column of an unusable row only if any client can take it: within the size
    and depth limits (else None / {}, and the column is unreadable); options as an object."""
    for name in ("payload", "options"):
        if name in unreadable:
            continue
        try:
            check_json(name, values[name], rules.max_payload_bytes)
        except ConfigError as exc:
            values[name] = None
            unreadable[name] = exc.reason
    options = values["options"]
    if not isinstance(options, dict):
        if options is not None and "options" not in unreadable:  # JSON null reads as {}
            unreadable["options"] = "must be a JSON object"
        values["options"] = {}


class Unreadable:
    """A stored column that cannot be read (:attr:`RowView.unreadable`), standing in for its
    value where a row is compared or merged with a new one: it equals nothing
    (:func:`same_value`), so whatever replaces it is a change, and a PATCH merge that keeps it is
    refused naming the field."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"<unreadable: {self.reason}>"


def stored_value(row: RowView, name: str) -> Any:
    """Column ``name`` of ``row`` as stored, or :class:`Unreadable` with the reason."""
    if name in row.unreadable:
        return Unreadable(row.unreadable[name])
    return row.values[name]


def same_value(name: str, old: Any, new: Any) -> bool:
    """Whether writing ``new`` leaves column ``name`` as stored (``old``): JSON compared as
    canonical text (so ``1``, ``1.0`` and ``true`` differ; a value that is no JSON equals
    nothing), instants as instants, anything else by type and value. An :class:`Unreadable`
    equals nothing."""
    if isinstance(old, Unreadable):
        return False
    if name in ("payload", "options"):
        try:
            return canonical_json(old) == canonical_json(new)
        except (TypeError, ValueError, RecursionError):
            return False
    return type(old) is type(new) and bool(old == new)
