"""Schedules as files: ``periodic-manager import FILE`` and ``periodic-manager export``.

A file lists schedules: JSON or YAML (a list, or ``{"schedules": [...]}``) or TOML (``[[schedules]]``
tables). Each entry has the fields of ``POST /schedules``: ``name``, ``spec``, ``task_type``
(required), ``timezone``, ``payload``, ``options``, ``enabled``, ``description``, ``anchor``. The
file is the desired state of each schedule it names: a field left out takes its default.

Import upserts by name in one transaction after validating every entry as the manager would (one
bad entry: nothing is written); ``prune`` also deletes the schedules the file does not name (with
their state and history). Unchanged rows are not touched.

A row with errors (one the manager rejects, or whose columns cannot all be read) is exported as
stored, marked ``invalid``, and imported back as stored (:mod:`periodic_manager.schedules.as_stored`): an
export restores every row the API lists, errors included.
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

from periodic_manager.db import judge as dbjudge
from periodic_manager.db import rows as dbrows
from periodic_manager.db import view as dbview
from periodic_manager.db.models import LastGood, PeriodicJob, Run, ScheduleState
from periodic_manager.errors import ConfigError, PeriodicManagerError
from periodic_manager.schedules import as_stored
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.rules import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    canonical_json,
    check_text,
    validate_target,
)

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
            from periodic_manager.schedules.yaml_load import (
                load as load_yaml,  # refuses alias bombs
            )

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
    sqlite: bool | None = None,
) -> list[dict[str, Any]]:
    """Every entry complete with defaults and validated as the manager validates a row (payload
    and options at most ``max_payload_bytes`` of canonical JSON each; ``targets``: the deployment's
    ``Settings.configured_targets()``, checked as the API checks them); FileError names the entry
    and field. An entry marked ``invalid`` is a row as stored: only checked for what its columns
    can hold (on the backend ``sqlite`` says, when given)."""
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, Any]] = set()
    for i, raw in enumerate(entries, start=1):
        name = raw.get("name") if isinstance(raw, dict) else None
        where = f"{source}: entry {i}" + (f" ({name!r})" if isinstance(name, str) else "")
        try:
            if isinstance(raw, dict) and as_stored.MARK in raw:
                entry = _validate_stored(raw)
                if sqlite is not None:
                    as_stored.check_storable(entry, sqlite)
            else:
                entry = _validate_entry(raw, max_payload_bytes, targets)
        except ConfigError as exc:
            raise FileError(f"{where}: {exc.field}: {exc.reason}") from None
        identity = as_stored.identity(entry)
        if identity in seen:
            raise FileError(f"{where}: name: appears twice in the file")
        seen.add(identity)
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


def _validate_stored(raw: dict[str, Any]) -> dict[str, Any]:
    """An entry marked ``invalid``: a row as stored. Not judged (it is invalid, and says so);
    each column only has to be something the column can hold."""
    known = (*FIELDS, as_stored.MARK, as_stored.RAW)
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(str(unknown[0]), f"unknown field (known: {', '.join(known)})")
    mark = raw[as_stored.MARK]
    if not isinstance(mark, str) or not mark:
        raise ConfigError(as_stored.MARK, "must be the row's error as text ('<field>: <reason>')")
    given = raw.get(as_stored.RAW, {})
    if not isinstance(given, dict):
        raise ConfigError(as_stored.RAW, "must be a table of column = stored text")
    raws = {str(c): as_stored.parse_raw(str(c), v) for c, v in given.items()}
    both = sorted(set(raws) & set(raw))
    if both:
        raise ConfigError(both[0], "given both as a value and in raw")
    for key in REQUIRED:
        if key not in raw and key not in raws:
            raise ConfigError(key, "is required (as a value, or as stored in raw)")
    entry = {k: v for k, v in {**DEFAULTS, **raw}.items() if k in FIELDS and k not in raws}
    for key in ("name", "spec", "task_type", "timezone"):
        if key in entry and not isinstance(entry[key], str):
            raise ConfigError(key, "must be a string")
    if entry.get("description") is not None and not isinstance(entry["description"], str):
        raise ConfigError("description", "must be a string")
    if "enabled" in entry and not isinstance(entry["enabled"], bool):
        raise ConfigError("enabled", "must be true or false (or given as stored in raw)")
    if "anchor" in entry:
        entry["anchor"] = _anchor(entry["anchor"])
    for key in as_stored.JSON_COLUMNS:
        if key in entry:
            as_stored.check_json_value(key, entry[key])
    return {**entry, as_stored.MARK: mark, as_stored.RAW: raws}


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
    update_ids: list[int] = field(default_factory=list)  # the row of each update
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
    engine: AsyncEngine,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    targets: Collection[str] | None = None,
) -> list[as_stored.StoredRow]:
    """Every row, read raw and judged like the API judges it (whatever a row holds), with each
    column's stored form."""
    sqlite = engine.dialect.name == "sqlite"
    query = select(*dbrows.columns(sqlite, display=True), *as_stored.extras(sqlite))
    n = len(dbrows.FIELDS)
    async with engine.connect() as conn:
        await as_stored.prepare(conn, sqlite)
        raws = (await conn.execute(query.order_by(PeriodicJob.id))).all()
    rules = dbjudge.Rules(sqlite, max_payload_bytes, _target_check(targets))
    return [as_stored.StoredRow(dbview.view(rules, tuple(r[:n])), tuple(r[n:]), sqlite) for r in raws]


def _target_check(targets: Collection[str] | None) -> dbjudge.Check | None:
    """The deployment's check of ``options.target``, as the API and the manager make it."""
    if targets is None:
        return None

    def check(config: PeriodicTaskConfig) -> None:
        validate_target(config.options, targets)

    return check


def _stored_value(row: dbview.RowView, key: str) -> Any:
    if key in row.unreadable:
        return _Unreadable(row.unreadable[key])
    return row.values[key]


def _changes(entry: dict[str, Any], row: as_stored.StoredRow) -> dict[str, tuple[Any, Any]]:
    """What writing ``entry`` would change in ``row``: each column, old and new. A column the
    entry gives as stored (``raw``) is compared byte for byte (timestamps only when given so)."""
    raws = as_stored.raws_of(entry)
    out: dict[str, tuple[Any, Any]] = {}
    for key in (*FIELDS, "created_at", "updated_at"):
        if key in raws:
            old = row.raw(key)
            if old is None or old[0] != raws[key][0]:
                out[key] = (old, raws[key])
        elif key in FIELDS and not _same(key, old := _stored_value(row.view, key), entry[key]):
            out[key] = (old, entry[key])
    return out


async def plan(
    engine: AsyncEngine,
    desired: Sequence[dict[str, Any]],
    prune: bool,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> Plan:
    stored = await _stored(engine, max_payload_bytes)
    by_identity = {r.identity(): r for r in stored}
    out = Plan()
    named = {as_stored.identity(e) for e in desired}
    for entry in desired:
        row = by_identity.get(as_stored.identity(entry))
        if row is None:
            out.create.append(entry)
            continue
        changes = _changes(entry, row)
        if changes:
            out.update.append((entry, changes))
            out.update_ids.append(row.view.id)
        else:
            out.unchanged += 1
    absent = sorted(
        (r.view for r in stored if r.identity() not in named),
        key=lambda r: (r.values["name"] is None, r.values["name"] or "", r.id),
    )
    if prune:
        out.delete = [_label(r) for r in absent]
        out.delete_ids = [r.id for r in absent]
    else:
        out.kept = len(absent)
    return out


def _label(row: dbview.RowView) -> str:
    name = row.values["name"]
    return name if name is not None else f"#{row.id} (name: {row.unreadable.get('name')})"


def _entry_label(entry: dict[str, Any]) -> str:
    kind, name = as_stored.identity(entry)
    label = name if kind == "name" else f"(name as stored: {as_stored.shown((name, True))})"
    if as_stored.MARK in entry:
        label += f" (as stored, invalid: {entry[as_stored.MARK]})"
    return str(label)


def _short(value: Any) -> str:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], bytes):
        text = as_stored.shown(value)
    else:
        text = repr(value.isoformat() if isinstance(value, datetime) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def render(p: Plan) -> list[str]:
    lines = [f"+ create {_entry_label(e)}" for e in p.create]
    for entry, changes in p.update:
        parts = [f"{k} {_short(old)} -> {_short(new)}" for k, (old, new) in changes.items()]
        lines.append(f"~ update {_entry_label(entry)}: " + "; ".join(parts))
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
    sqlite = engine.dialect.name == "sqlite"
    async with engine.begin() as conn:
        for entry in p.create:
            values = {k: entry[k] for k in FIELDS if k in entry}
            stamps = {"created_at": now, "updated_at": now, "effective_at": now}
            row = as_stored.written({**values, **stamps}, entry, sqlite)
            await conn.execute(insert(PeriodicJob).values(**row))
        for (entry, changes), row_id in zip(p.update, p.update_ids, strict=True):
            raws = as_stored.raws_of(entry)
            values = {k: entry[k] for k in changes if k not in raws}
            values.update({k: as_stored.bind(k, raws[k], sqlite) for k in changes if k in raws})
            values.setdefault("updated_at", now)
            # New slots or keys, or a resume: nothing before now may be looked back at.
            if TIMING & changes.keys() or (entry.get("enabled") and "enabled" in changes):
                values["effective_at"] = now
            await conn.execute(update(PeriodicJob).where(t.id == row_id).values(**values))
            if "updated_at" in raws:
                # Written again alone: the edit above has the triggers stamp it (0004).
                stamp = as_stored.bind("updated_at", raws["updated_at"], sqlite)
                await conn.execute(update(PeriodicJob).where(t.id == row_id).values(updated_at=stamp))
        if p.delete_ids:
            keys = [str(i) for i in p.delete_ids]
            await conn.execute(delete(PeriodicJob).where(t.id.in_(p.delete_ids)))
            await conn.execute(delete(ScheduleState).where(ScheduleState.schedule_key.in_(keys)))
            await conn.execute(delete(Run).where(Run.schedule_key.in_(keys)))
            await conn.execute(delete(LastGood).where(LastGood.schedule_key.in_(keys)))


# -- export ---------------------------------------------------------------------------------------


@dataclass
class Export:
    entries: list[dict[str, Any]]
    # One line per row exported as stored (it has errors): "schedule #7 ('name'): payload: ...".
    invalid: list[str] = field(default_factory=list)


async def export_entries(
    engine: AsyncEngine,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    targets: Collection[str] | None = None,
    *,
    nulls_as_stored: bool = False,
) -> Export:
    """Every row as a file entry, ordered by name, defaults left out. A row with errors (as the
    API judges it with ``targets``, the deployment's configured targets) is exported as stored,
    marked ``invalid`` (see :mod:`periodic_manager.schedules.as_stored`); ``invalid`` lists them.
    ``nulls_as_stored`` (TOML, which has no null): such a row's payload or options holding a
    JSON null is given as its stored text (a schedule's is refused by :func:`dump`)."""
    out = Export([])
    stored = await _stored(engine, max_payload_bytes, targets)
    for row in sorted(stored, key=lambda r: (r.view.values["name"] or "", r.view.id)):
        v = row.view
        if not v.errors:
            out.entries.append(_entry_of(v))
            continue
        out.entries.append(_stored_entry_of(row, nulls_as_stored))
        name = v.values["name"]
        field_, reason = v.errors[0]
        out.invalid.append(
            f"schedule #{v.id}" + (f" ({name!r})" if name else "") + f": {field_}: {reason}"
        )
    return out


def _file_value(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _entry_of(row: dbview.RowView) -> dict[str, Any]:
    """A row without errors as a file entry: its fields, defaults left out."""
    entry: dict[str, Any] = {k: row.values[k] for k in REQUIRED}
    for key, default in DEFAULTS.items():
        value = row.values[key]
        if not _same(key, value, default) and not (key == "anchor" and value is None):
            entry[key] = _file_value(value)
    return entry


def _stored_entry_of(row: as_stored.StoredRow, nulls_as_stored: bool = False) -> dict[str, Any]:
    """A row with errors as a file entry: as stored, marked ``invalid`` with its first error; the
    columns that cannot be read in ``raw``, as stored (defaults left out, as for any entry)."""
    v = row.view
    entry: dict[str, Any] = {}
    raw: dict[str, Any] = {}
    for key in (*FIELDS, "created_at", "updated_at"):
        as_text = (
            nulls_as_stored
            and key in as_stored.JSON_COLUMNS
            and v.values[key] is not None
            and _has_null(v.values[key])
        )
        if key in v.unreadable or as_text:
            stored = row.raw(key)
            if stored is not None:
                raw[key] = as_stored.file_form(stored)
        elif key in REQUIRED:
            entry[key] = v.values[key]
        elif key in DEFAULTS:
            value = v.values[key]
            if not _same(key, value, DEFAULTS[key]) and not (key == "anchor" and value is None):
                entry[key] = _file_value(value)
    field_, reason = v.errors[0]
    entry[as_stored.MARK] = f"{field_}: {reason}"
    if raw:
        entry[as_stored.RAW] = raw
    return entry


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
                f"schedule {entry.get('name')!r} holds a JSON null, which TOML cannot express; "
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
