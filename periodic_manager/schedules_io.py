"""Schedules as files: ``periodic-manager import FILE`` and ``periodic-manager export``.

A file lists schedules: JSON or YAML (a list, or ``{"schedules": [...]}``) or TOML (``[[schedules]]``
tables). Each entry has the fields of ``POST /schedules``: ``name``, ``spec``, ``task_type``
(required), ``timezone``, ``payload``, ``options``, ``enabled``, ``description``, ``anchor``. The
file is the desired state of each schedule it names: a field left out takes its default.

Import upserts by name in one transaction after validating every entry as the manager would (one
bad entry: nothing is written); ``prune`` also deletes the schedules the file does not name (with
their state and history). Unchanged rows are not touched.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.config import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    PeriodicTaskConfig,
    canonical_json,
    check_text,
)
from periodic_manager.db import rows as dbrows
from periodic_manager.db.models import PeriodicJob, Run, ScheduleState
from periodic_manager.errors import ConfigError, PeriodicManagerError

FORMATS = ("json", "yaml", "toml")
REQUIRED = ("name", "spec", "task_type")
DEFAULTS: dict[str, Any] = {
    "timezone": "UTC",
    "payload": None,
    "options": {},
    "enabled": True,
    "description": None,
    "anchor": None,
}
FIELDS = (*REQUIRED, *DEFAULTS)
TIMING = frozenset({"name", "spec", "timezone", "anchor"})  # see migration 0004


class FileError(PeriodicManagerError):
    """The file cannot be read or an entry is invalid; the message is one readable line."""


def format_of(path: str, given: str | None = None) -> str:
    if given is not None:
        return given
    suffix = Path(path).suffix.lower().lstrip(".")
    fmt = {"yml": "yaml"}.get(suffix, suffix)
    if fmt not in FORMATS:
        raise FileError(
            f"{path}: cannot tell the format from the name; use --format json|yaml|toml"
        )
    return fmt


def parse(text: str, fmt: str, source: str = "input") -> list[Any]:
    """The list of raw entries in ``text``."""
    try:
        if fmt == "json":
            doc: Any = json.loads(text)
        elif fmt == "yaml":
            from periodic_manager.yaml_load import load as load_yaml  # refuses alias bombs

            doc = load_yaml(text)
        else:
            doc = tomllib.loads(text)
    except Exception as exc:  # every parser's error becomes one line naming the file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FileError(f"{source}: not valid {fmt.upper()}: {first}") from None
    if isinstance(doc, dict) and set(doc) == {"schedules"}:
        doc = doc["schedules"]
    if doc is None:
        doc = []
    if not isinstance(doc, list):
        raise FileError(f"{source}: expected a list of schedules (or a 'schedules' list)")
    return doc


def validate(
    entries: Sequence[Any],
    source: str = "input",
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    targets: Collection[str] | None = None,
) -> list[dict[str, Any]]:
    """Every entry complete with defaults and validated as the manager validates a row (payload
    and options at most ``max_payload_bytes`` of canonical JSON each; ``targets``: the deployment's
    ``Settings.configured_targets()``, checked as the API checks them); FileError names the entry
    and field."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, raw in enumerate(entries, start=1):
        name = raw.get("name") if isinstance(raw, dict) else None
        where = f"{source}: entry {i}" + (f" ({name!r})" if isinstance(name, str) else "")
        try:
            entry = _validate_entry(raw, max_payload_bytes, targets)
        except ConfigError as exc:
            raise FileError(f"{where}: {exc.field}: {exc.reason}") from None
        if entry["name"] in seen:
            raise FileError(f"{where}: name: appears twice in the file")
        seen.add(entry["name"])
        out.append(entry)
    return out


def _validate_entry(
    raw: Any, max_payload_bytes: int, targets: Collection[str] | None = None
) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError("entry", "must be a table/object of schedule fields")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise ConfigError(str(unknown[0]), f"unknown field (known: {', '.join(FIELDS)})")
    for key in REQUIRED:
        if key not in raw:
            raise ConfigError(key, "is required")
    entry = {**DEFAULTS, **raw}
    if not isinstance(entry["enabled"], bool):
        raise ConfigError("enabled", "must be true or false")
    if entry["description"] is not None and not isinstance(entry["description"], str):
        raise ConfigError("description", "must be a string")
    entry["anchor"] = _anchor(entry["anchor"])
    for key in ("name", "spec", "timezone", "task_type", "description"):
        if isinstance(entry[key], str):
            check_text(key, entry[key])
    cfg = PeriodicTaskConfig.create(
        name=entry["name"],
        spec=entry["spec"],
        task_type=entry["task_type"],
        payload=entry["payload"],
        options=entry["options"],
        timezone=entry["timezone"],
        anchor=entry["anchor"],
        max_payload_bytes=max_payload_bytes,
        allowed_targets=targets,
    )
    entry["options"] = dict(cfg.options)
    return entry


def canonical_json_or(value: Any) -> str:
    try:
        return canonical_json(value)
    except (TypeError, ValueError):
        return ""  # PeriodicTaskConfig.create reports it, naming the field


def _anchor(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError("anchor", "must be an ISO 8601 instant with a UTC offset") from None
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise ConfigError("anchor", "must be an ISO 8601 instant with a UTC offset")
    return value


# -- plan and apply -------------------------------------------------------------------------------


@dataclass
class Plan:
    create: list[dict[str, Any]] = field(default_factory=list)
    update: list[tuple[dict[str, Any], dict[str, tuple[Any, Any]]]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)  # what render() shows of each deleted row
    delete_ids: list[int] = field(default_factory=list)
    unchanged: int = 0
    kept: int = 0  # rows not in the file, left alone (no --prune)

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)


class _Unreadable:
    """A stored column that cannot be read: never equal to what a file says (so it is
    rewritten), shown in the plan with the reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"<unreadable: {self.reason}>"


def _same(key: str, old: Any, new: Any) -> bool:
    if isinstance(old, _Unreadable):
        return False
    if key in ("payload", "options"):
        return canonical_json_or(old) == canonical_json_or(new) and canonical_json_or(old) != ""
    if key == "anchor" and old is not None and new is not None:
        return bool(old == new)  # aware datetimes compare as instants
    return type(old) is type(new) and bool(old == new)


async def _stored(
    engine: AsyncEngine, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> list[dbrows.RowView]:
    """Every row, read raw and judged like the manager does (whatever a row holds)."""
    sqlite = engine.dialect.name == "sqlite"
    query = select(*dbrows.columns(sqlite, display=True)).order_by(PeriodicJob.id)
    async with engine.connect() as conn:
        raws = (await conn.execute(query)).all()
    rules = dbrows.Rules(sqlite, max_payload_bytes)
    return [dbrows.view(rules, tuple(raw)) for raw in raws]


def _stored_value(row: dbrows.RowView, key: str) -> Any:
    if key in row.unreadable:
        return _Unreadable(row.unreadable[key])
    return row.values[key]


async def plan(
    engine: AsyncEngine,
    desired: Sequence[dict[str, Any]],
    prune: bool,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> Plan:
    stored = await _stored(engine, max_payload_bytes)
    by_name = {r.values["name"]: r for r in stored if r.values["name"] is not None}
    out = Plan()
    names = {e["name"] for e in desired}
    for entry in desired:
        row = by_name.get(entry["name"])
        if row is None:
            out.create.append(entry)
            continue
        changes = {
            k: (old, entry[k])
            for k in FIELDS
            if not _same(k, old := _stored_value(row, k), entry[k])
        }
        if changes:
            out.update.append((entry, changes))
        else:
            out.unchanged += 1
    absent = sorted(
        (r for r in stored if r.values["name"] not in names),
        key=lambda r: (r.values["name"] is None, r.values["name"] or "", r.id),
    )
    if prune:
        out.delete = [_label(r) for r in absent]
        out.delete_ids = [r.id for r in absent]
    else:
        out.kept = len(absent)
    return out


def _label(row: dbrows.RowView) -> str:
    name = row.values["name"]
    return name if name is not None else f"#{row.id} (name: {row.unreadable.get('name')})"


def _short(value: Any) -> str:
    text = repr(value.isoformat() if isinstance(value, datetime) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def render(p: Plan) -> list[str]:
    lines = [f"+ create {e['name']}" for e in p.create]
    for entry, changes in p.update:
        parts = [f"{k} {_short(old)} -> {_short(new)}" for k, (old, new) in changes.items()]
        lines.append(f"~ update {entry['name']}: " + "; ".join(parts))
    lines += [f"- delete {name}" for name in p.delete]
    summary = (
        f"{len(p.create)} to create, {len(p.update)} to update, {len(p.delete)} to delete, "
        f"{p.unchanged} unchanged"
    )
    if p.kept:
        summary += f", {p.kept} not in the file kept (--prune deletes them)"
    return [*lines, summary]


async def apply(engine: AsyncEngine, p: Plan, now: datetime) -> None:
    """Write the plan in one transaction. Updates write only the columns that change (by name;
    no row is loaded, so no stored value can get in the way)."""
    t = PeriodicJob.__table__.c
    async with engine.begin() as conn:
        for entry in p.create:
            values = {k: entry[k] for k in FIELDS}
            stamps = {"created_at": now, "updated_at": now, "effective_at": now}
            await conn.execute(insert(PeriodicJob).values(**values, **stamps))
        for entry, changes in p.update:
            values = {k: entry[k] for k in changes}
            values["updated_at"] = now
            # New slots or keys, or a resume: nothing before now may be looked back at.
            if TIMING & changes.keys() or (entry["enabled"] and "enabled" in changes):
                values["effective_at"] = now
            await conn.execute(update(PeriodicJob).where(t.name == entry["name"]).values(**values))
        if p.delete_ids:
            keys = [str(i) for i in p.delete_ids]
            await conn.execute(delete(PeriodicJob).where(t.id.in_(p.delete_ids)))
            await conn.execute(delete(ScheduleState).where(ScheduleState.schedule_key.in_(keys)))
            await conn.execute(delete(Run).where(Run.schedule_key.in_(keys)))


# -- export ---------------------------------------------------------------------------------------


@dataclass
class Export:
    entries: list[dict[str, Any]]
    # One line per row left out because a column cannot be read (the file could not be
    # imported back as it is stored): "schedule #7 ('name'): payload: not valid JSON ...".
    skipped: list[str] = field(default_factory=list)


async def export_entries(
    engine: AsyncEngine, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> Export:
    """Every row as a file entry (ordered by name; defaults left out). A row whose columns
    cannot be read is not exported; ``skipped`` says which and why. Rows the manager rejects
    for other reasons (a bad spec, say) are exported as stored."""
    out = Export([])
    stored = await _stored(engine, max_payload_bytes)
    for row in sorted(stored, key=lambda r: (r.values["name"] or "", r.id)):
        unreadable = {k: r for k, r in row.unreadable.items() if k in FIELDS}
        if unreadable:
            key, reason = next(iter(unreadable.items()))
            name = row.values["name"]
            out.skipped.append(
                f"schedule #{row.id}" + (f" ({name!r})" if name else "") + f": {key}: {reason}"
            )
            continue
        entry: dict[str, Any] = {k: row.values[k] for k in REQUIRED}
        for key, default in DEFAULTS.items():
            value = row.values[key]
            if not _same(key, value, default) and not (key == "anchor" and value is None):
                entry[key] = value.isoformat() if isinstance(value, datetime) else value
        out.entries.append(entry)
    return out


def dump(entries: list[dict[str, Any]], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(entries, indent=2, ensure_ascii=False) + "\n"
    if fmt == "yaml":
        import yaml

        return str(yaml.safe_dump(entries, sort_keys=False, allow_unicode=True))
    import tomli_w

    for entry in entries:
        if _has_null(entry):
            raise FileError(
                f"schedule {entry['name']!r} holds a JSON null, which TOML cannot express; "
                "export as json or yaml"
            )
    try:
        return tomli_w.dumps({"schedules": entries})
    except (TypeError, ValueError) as exc:
        raise FileError(f"cannot write TOML: {exc}; export as json or yaml") from None


def _has_null(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, dict):
        return any(_has_null(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_null(v) for v in value)
    return False
