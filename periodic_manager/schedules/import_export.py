"""What ``periodic-manager import`` and ``export`` do with the database.

Import upserts by name in one transaction after every entry was validated
(:mod:`periodic_manager.schedules.files`): :func:`plan` compares the file with the rows,
:func:`render` shows the plan, :func:`apply` writes it through the schedule writer
(:mod:`periodic_manager.db.schedule_writer`). ``prune`` also deletes the schedules the file does
not name (with their state and history). Unchanged rows are not touched.

Export writes every row as a file entry (:func:`export_entries`); a row with errors is exported
as stored, marked ``invalid`` (:mod:`periodic_manager.schedules.as_stored`), so that an export
restores every row the API lists, errors included.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from periodic_manager.db import calendars as dbcalendars
from periodic_manager.db import rows as dbrows
from periodic_manager.db import schedule_writer
from periodic_manager.db import view as dbview
from periodic_manager.db.engine import Engine, reads_bytes
from periodic_manager.db.judge import rules_for
from periodic_manager.db.stored import JSON_COLUMNS, StoredRow, read_stored
from periodic_manager.schedules import as_stored
from periodic_manager.schedules.calendars import CalendarSpec
from periodic_manager.schedules.files import has_null
from periodic_manager.schedules.judge import DEFAULTS, FIELDS, REQUIRED
from periodic_manager.schedules.rules import DEFAULT_MAX_PAYLOAD_BYTES

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
    # Calendars of the file to write (new or changed), by name, and whether each is new.
    calendars: dict[str, tuple[CalendarSpec, bool]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete or self.calendars)


async def _stored(
    engine: Engine,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    targets: Collection[str] | None = None,
) -> list[StoredRow]:
    """Every row, judged like the API judges it with ``targets`` (the deployment's configured
    targets), with each column's stored form."""
    rules = rules_for(reads_bytes(engine), max_payload_bytes, targets)
    return await read_stored(engine, rules.with_calendars(await stored_calendars(engine)))


def _changes(entry: dict[str, Any], row: StoredRow) -> dict[str, tuple[Any, Any]]:
    """What writing ``entry`` would change in ``row``: each column, old and new. A column the
    entry gives as stored (``raw``) is compared byte for byte (timestamps only when given so)."""
    raws = as_stored.raws_of(entry)
    out: dict[str, tuple[Any, Any]] = {}
    for key in (*FIELDS, "created_at", "updated_at"):
        if key in raws:
            old = row.raw(key)
            if old is None or old[0] != raws[key][0]:
                out[key] = (old, raws[key])
        elif key in FIELDS and not dbview.same_value(
            key, old := dbview.stored_value(row.view, key), entry[key]
        ):
            out[key] = (old, entry[key])
    return out


async def stored_calendars(engine: Engine) -> dict[str, CalendarSpec]:
    """The database's usable calendars by name."""
    async with engine.connect() as conn:
        return await dbcalendars.specs(conn)


async def plan(
    engine: Engine,
    desired: Sequence[dict[str, Any]],
    prune: bool,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    calendars: Mapping[str, CalendarSpec] | None = None,
) -> Plan:
    """What importing ``desired`` (validated entries) and ``calendars`` (the file's, checked)
    would do. Calendars are upserted, never deleted by an import."""
    stored = await _stored(engine, max_payload_bytes)
    have = await stored_calendars(engine) if calendars else {}
    by_identity = {as_stored.row_identity(r): r for r in stored}
    out = Plan()
    for name, spec in (calendars or {}).items():
        old = have.get(name)
        if old is None or old.text != spec.text:
            out.calendars[name] = (spec, old is None)
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
        (r.view for r in stored if as_stored.row_identity(r) not in named),
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
    lines = [
        f"{'+ create' if new else '~ update'} calendar {name}: {spec.text[:60]}"
        for name, (spec, new) in p.calendars.items()
    ]
    lines += [f"+ create {_entry_label(e)}" for e in p.create]
    for entry, changes in p.update:
        parts = [f"{k} {_short(old)} -> {_short(new)}" for k, (old, new) in changes.items()]
        lines.append(f"~ update {_entry_label(entry)}: " + "; ".join(parts))
    lines += [f"- delete {name}" for name in p.delete]
    summary = (
        (f"{len(p.calendars)} calendar(s) to write, " if p.calendars else "")
        + f"{len(p.create)} to create, {len(p.update)} to update, {len(p.delete)} to delete, "
        f"{p.unchanged} unchanged"
    )
    if p.kept:
        summary += f", {p.kept} not in the file kept (--prune deletes them)"
    return [*lines, summary]


async def apply(engine: Engine, p: Plan, now: datetime) -> None:
    """Write the plan: its calendars first (db/calendars.py), then the schedules in one
    transaction, through the schedule writer (stamps, columns as stored, deletions with what is
    kept of the rows). Updates write only the columns that change."""
    if p.calendars:
        async with engine.connect() as conn:
            for name, (spec, _) in p.calendars.items():
                await dbcalendars.put(conn, name, spec, now)
    rows = [
        schedule_writer.RowWrite({k: e[k] for k in FIELDS if k in e}, as_stored.raws_of(e))
        for e in p.create
    ]
    for (entry, changes), row_id in zip(p.update, p.update_ids, strict=True):
        raws = as_stored.raws_of(entry)
        rows.append(
            schedule_writer.RowWrite(
                {k: entry[k] for k in changes if k not in raws},
                {k: raws[k] for k in changes if k in raws},
                row_id=row_id,
                was_enabled=changes["enabled"][0] if "enabled" in changes else None,
                updated_at=raws.get("updated_at"),
            )
        )
    await schedule_writer.write_import(engine, rows, p.delete_ids, now)


# -- export ---------------------------------------------------------------------------------------


@dataclass
class Export:
    entries: list[dict[str, Any]]
    # One line per row exported as stored (it has errors): "schedule #7 ('name'): payload: ...".
    invalid: list[str] = field(default_factory=list)
    # Every usable calendar by name, as a file holds it ({"dates": [...]} or {"holidays": {...}}).
    calendars: dict[str, Any] = field(default_factory=dict)


async def export_entries(
    engine: Engine,
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
    out.calendars = {n: s.as_json() for n, s in sorted((await stored_calendars(engine)).items())}
    stored = await _stored(engine, max_payload_bytes, targets)
    for row in sorted(stored, key=lambda r: (r.view.values["name"] or "", r.view.id)):
        v = row.view
        # An unreadable pause column (not part of a file entry) makes no entry invalid; any
        # other error comes before it (see dbview.view).
        if all(f in dbrows.PAUSED for f, _ in v.errors):
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
        if not dbview.same_value(key, value, default) and not (key == "anchor" and value is None):
            entry[key] = _file_value(value)
    return entry


def _stored_entry_of(row: StoredRow, nulls_as_stored: bool = False) -> dict[str, Any]:
    """A row with errors as a file entry: as stored, marked ``invalid`` with its first error; the
    columns that cannot be read in ``raw``, as stored (defaults left out, as for any entry)."""
    v = row.view
    entry: dict[str, Any] = {}
    raw: dict[str, Any] = {}
    for key in (*FIELDS, "created_at", "updated_at"):
        as_text = (
            nulls_as_stored
            and key in JSON_COLUMNS
            and v.values[key] is not None
            and has_null(v.values[key])
        )
        if key in v.unreadable or as_text:
            stored = row.raw(key)
            if stored is not None:
                raw[key] = as_stored.file_form(stored)
        elif key in REQUIRED:
            entry[key] = v.values[key]
        elif key in DEFAULTS:
            value = v.values[key]
            if not dbview.same_value(key, value, DEFAULTS[key]) and not (
                key == "anchor" and value is None
            ):
                entry[key] = _file_value(value)
    field_, reason = v.errors[0]
    entry[as_stored.MARK] = f"{field_}: {reason}"
    if raw:
        entry[as_stored.RAW] = raw
    return entry
