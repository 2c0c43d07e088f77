"""Schedule rows <-> API bodies: validation of a (merged) row and its upcoming slots."""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from api.schemas import Schedule, ScheduleWithRuns
from periodic_manager import cron
from periodic_manager.config import PeriodicTaskConfig
from periodic_manager.db.models import PeriodicJob
from periodic_manager.errors import ConfigError

NEXT_RUNS = 3
MAX_JSON_DEPTH = 100
# Errors a stored row (possibly written with SQL) can raise while its slots are computed.
SLOT_ERRORS = (ValueError, TypeError, ArithmeticError, LookupError, StopIteration)


def _check_json_text(value: Any, field: str) -> None:
    """Reject what no backend can store: NUL characters (PostgreSQL text and JSONB), unpaired
    surrogates (not UTF-8) and nesting deep enough to hit recursion limits when serialised."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ConfigError(field, f"nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(item, str):
            _check_text(item, field)
        elif isinstance(item, dict):
            for key, sub in item.items():
                _check_text(str(key), field)
                stack.append((sub, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((sub, depth + 1) for sub in item)


def _check_text(text: str, field: str) -> None:
    if "\x00" in text:
        raise ConfigError(field, "must not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(field, "must be valid Unicode (unpaired surrogate)") from None


def validate_row(
    fields: dict[str, Any], now: datetime, *, targets: Collection[str] | None = None
) -> PeriodicTaskConfig:
    """Validate a complete row (a new one or the merge of a PATCH) exactly as the manager would,
    and check that it fires at least once after ``now``. Raises ConfigError naming the field.

    ``targets``: the targets the deployment runs (``Settings.configured_targets()``); a row whose
    ``options.target`` names another is refused, as the manager would refuse it at sync time.
    """
    for name in ("name", "spec", "timezone", "task_type", "description"):
        if isinstance(fields.get(name), str):
            _check_text(fields[name], name)
    _check_json_text(fields.get("payload"), "payload")
    _check_json_text(fields.get("options"), "options")
    anchor = fields.get("anchor")
    if anchor is not None:
        try:
            anchor.astimezone(UTC)
        except OverflowError:
            raise ConfigError("anchor", "out of the representable range of instants") from None
    cfg = PeriodicTaskConfig.create(
        name=fields["name"],
        spec=fields["spec"],
        task_type=fields["task_type"],
        payload=fields.get("payload"),
        options=fields.get("options"),
        timezone=fields["timezone"],
        anchor=anchor,
        allowed_targets=targets,
    )
    if not next_runs(cfg.spec, cfg.timezone, cfg.anchor, now, 1):
        raise ConfigError("spec", "has no fire time after now")
    return cfg


def next_runs(
    spec: str, timezone: str, anchor: datetime | None, now: datetime, n: int = NEXT_RUNS
) -> list[datetime]:
    """The next ``n`` slots after ``now`` in UTC, or ``[]`` if they cannot be computed."""
    try:
        return [
            t.astimezone(UTC)
            for t in cron.parse(spec, tz=timezone, anchor=anchor).next_fires(now, n)
        ]
    except SLOT_ERRORS:
        return []


def next_slot(
    spec: str | None, timezone: str | None, anchor: datetime | None, now: datetime
) -> datetime | None:
    if spec is None:
        return None
    try:
        return cron.parse(spec, tz=timezone or "UTC", anchor=anchor).next_after(now).astimezone(UTC)
    except SLOT_ERRORS:
        return None


def _utc(dt: datetime | None) -> datetime | None:
    return dt.astimezone(UTC) if dt is not None else None


def schedule_body(row: PeriodicJob) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "spec": row.spec,
        "timezone": row.timezone,
        "anchor": _utc(row.anchor),
        "task_type": row.task_type,
        "payload": row.payload,
        "options": row.options,
        "enabled": row.enabled,
        "description": row.description,
        "created_at": _utc(row.created_at),
        "updated_at": _utc(row.updated_at),
    }


def to_schedule(row: PeriodicJob) -> Schedule:
    return Schedule(**schedule_body(row))


def to_schedule_with_runs(row: PeriodicJob, now: datetime) -> ScheduleWithRuns:
    runs = next_runs(row.spec, row.timezone, row.anchor, now) if row.enabled else []
    return ScheduleWithRuns(**schedule_body(row), next_runs=runs)
