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
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.config import PeriodicTaskConfig, canonical_json
from periodic_manager.db.engine import sessionmaker
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


def validate(entries: Sequence[Any], source: str = "input") -> list[dict[str, Any]]:
    """Every entry complete with defaults and validated; FileError names the entry and field."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, raw in enumerate(entries, start=1):
        name = raw.get("name") if isinstance(raw, dict) else None
        where = f"{source}: entry {i}" + (f" ({name!r})" if isinstance(name, str) else "")
        try:
            entry = _validate_entry(raw)
        except ConfigError as exc:
            raise FileError(f"{where}: {exc.field}: {exc.reason}") from None
        if entry["name"] in seen:
            raise FileError(f"{where}: name: appears twice in the file")
        seen.add(entry["name"])
        out.append(entry)
    return out


def _validate_entry(raw: Any) -> dict[str, Any]:
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
        if isinstance(entry[key], str) and "\x00" in entry[key]:
            raise ConfigError(key, "must not contain NUL characters")
    if "\x00" in canonical_json_or(entry["payload"]) or "\x00" in canonical_json_or(
        entry["options"]
    ):
        raise ConfigError("payload", "must not contain NUL characters")
    cfg = PeriodicTaskConfig.create(
        name=entry["name"],
        spec=entry["spec"],
        task_type=entry["task_type"],
        payload=entry["payload"],
        options=entry["options"],
        timezone=entry["timezone"],
        anchor=entry["anchor"],
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
    delete: list[str] = field(default_factory=list)
    unchanged: int = 0
    kept: int = 0  # rows not in the file, left alone (no --prune)

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)


def _same(key: str, old: Any, new: Any) -> bool:
    if key in ("payload", "options"):
        return canonical_json_or(old) == canonical_json_or(new) and canonical_json_or(old) != ""
    if key == "anchor" and old is not None and new is not None:
        return bool(old == new)  # aware datetimes compare as instants
    return bool(old == new)


async def plan(engine: AsyncEngine, desired: Sequence[dict[str, Any]], prune: bool) -> Plan:
    async with sessionmaker(engine)() as session:
        rows = {r.name: r for r in (await session.execute(select(PeriodicJob))).scalars()}
    out = Plan()
    names = {e["name"] for e in desired}
    for entry in desired:
        row = rows.get(entry["name"])
        if row is None:
            out.create.append(entry)
            continue
        changes = {
            k: (getattr(row, k), entry[k])
            for k in FIELDS
            if not _same(k, getattr(row, k), entry[k])
        }
        if changes:
            out.update.append((entry, changes))
        else:
            out.unchanged += 1
    absent = sorted(n for n in rows if n not in names)
    if prune:
        out.delete = absent
    else:
        out.kept = len(absent)
    return out


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
    """Write the plan in one transaction."""
    async with sessionmaker(engine)() as session, session.begin():
        for entry in p.create:
            session.add(
                PeriodicJob(**{k: entry[k] for k in FIELDS}, created_at=now, updated_at=now)
            )
        for entry, changes in p.update:
            row = (
                await session.execute(select(PeriodicJob).where(PeriodicJob.name == entry["name"]))
            ).scalar_one()
            for key in changes:
                setattr(row, key, entry[key])
            row.updated_at = now
        if p.delete:
            ids = (
                (
                    await session.execute(
                        select(PeriodicJob.id).where(PeriodicJob.name.in_(p.delete))
                    )
                )
                .scalars()
                .all()
            )
            keys = [str(i) for i in ids]
            await session.execute(delete(PeriodicJob).where(PeriodicJob.id.in_(ids)))
            await session.execute(delete(ScheduleState).where(ScheduleState.schedule_key.in_(keys)))
            await session.execute(delete(Run).where(Run.schedule_key.in_(keys)))


# -- export ---------------------------------------------------------------------------------------


async def export_entries(engine: AsyncEngine) -> list[dict[str, Any]]:
    """Every row as a file entry (ordered by name; defaults left out)."""
    async with sessionmaker(engine)() as session:
        rows = (await session.execute(select(PeriodicJob).order_by(PeriodicJob.name))).scalars()
        out = []
        for row in rows:
            entry: dict[str, Any] = {k: getattr(row, k) for k in REQUIRED}
            for key, default in DEFAULTS.items():
                value = getattr(row, key)
                if not _same(key, value, default) and not (key == "anchor" and value is None):
                    entry[key] = value.isoformat() if isinstance(value, datetime) else value
            out.append(entry)
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
