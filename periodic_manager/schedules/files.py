"""Schedules as files, for ``periodic-manager import FILE`` and ``periodic-manager export``: reading
a file into entries checked as the manager checks a row, and writing entries out.

A file lists schedules: JSON or YAML (a list, or ``{"schedules": [...]}``) or TOML (``[[schedules]]``
tables). Each entry has the fields of ``POST /schedules``: ``name``, ``spec``, ``task_type``
(required), ``timezone``, ``payload``, ``options``, ``enabled``, ``description``, ``anchor``. The
file is the desired state of each schedule it names: a field left out takes its default.

Every entry is judged by the judge of every row (:mod:`periodic_manager.schedules.judge`), as the
API and the manager judge it (one bad entry: nothing is written); what an import then does to the database, and what an export reads from it, is
:mod:`periodic_manager.schedules.import_export`.

A file may also hold exclusion calendars (``options.exclude``): a ``calendars`` table by name beside
the ``schedules`` list (``{"calendars": {"holidays-de": {"holidays": {"country": "DE"}}},
"schedules": [...]}``), each checked as ``PUT /calendars/{name}`` checks it; an import writes them
before the schedules, an export writes every calendar.

A row with errors (one the manager rejects, or whose columns cannot all be read) is exported as
stored, marked ``invalid``, and imported back as stored (:mod:`periodic_manager.schedules.as_stored`): an
export restores every row the API lists, errors included.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from periodic_manager.db.stored import JSON_COLUMNS
from periodic_manager.errors import ConfigError, PeriodicManagerError
from periodic_manager.schedules import as_stored
from periodic_manager.schedules.calendars import CalendarSpec, check_name, check_spec
from periodic_manager.schedules.judge import (
    DEFAULTS,
    FIELDS,
    REQUIRED,
    Deployment,
    anchor_of,
    judge,
)
from periodic_manager.schedules.rules import DEFAULT_MAX_PAYLOAD_BYTES

FORMATS = ("json", "yaml", "toml")
MAX_CALENDARS = 10_000  # calendars one file may hold


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
    return parse_document(text, fmt, source)[0]


def parse_document(text: str, fmt: str, source: str = "input") -> tuple[list[Any], Any]:
    """The raw schedule entries in ``text`` and its raw ``calendars`` table (None: none)."""
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
    calendars: Any = None
    if isinstance(doc, dict) and set(doc) and set(doc) <= {"schedules", "calendars"}:
        calendars = doc.get("calendars")
        doc = doc.get("schedules", [])
    if doc is None:
        doc = []
    if not isinstance(doc, list):
        raise FileError(
            f"{source}: expected a list of schedules (or a 'schedules' list and a 'calendars' table)"
        )
    return doc, calendars


def validate_calendars(raw: Any, source: str = "input") -> dict[str, CalendarSpec]:
    """The file's ``calendars`` table, each name and content checked as the API checks them;
    FileError names the calendar and the field."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or len(raw) > MAX_CALENDARS:
        raise FileError(
            f"{source}: calendars: must be a table of at most {MAX_CALENDARS} calendars by name"
        )
    out: dict[str, CalendarSpec] = {}
    for name, content in raw.items():
        try:
            check_name(name, "calendars")
            out[name] = check_spec(content)
        except ConfigError as exc:
            shown = name if isinstance(name, str) else repr(name)
            raise FileError(
                f"{source}: calendar {shown[:70]!r}: {exc.field}: {exc.reason}"
            ) from None
    return out


def check_excludes(
    entries: Sequence[dict[str, Any]], calendars: Collection[str], source: str = "input"
) -> None:
    """Every calendar a valid entry's ``options.exclude`` names is in ``calendars`` (the file's
    and the database's); FileError names the entry and ``options.exclude`` otherwise."""
    for i, entry in enumerate(entries, start=1):
        options = entry.get("options") if as_stored.MARK not in entry else None
        names = options.get("exclude") if isinstance(options, dict) else None
        for name in names or ():
            if name not in calendars:
                raise FileError(
                    f"{source}: entry {i} ({entry['name']!r}): options.exclude: no calendar named"
                    f" {name!r} (in the file's calendars or the database)"
                )


def validate(
    entries: Sequence[Any],
    source: str = "input",
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    targets: Collection[str] | None = None,
    database: str | None = None,
) -> list[dict[str, Any]]:
    """Every entry complete with defaults and validated as the manager validates a row (payload
    and options at most ``max_payload_bytes`` of canonical JSON each; ``targets``: the deployment's
    ``Settings.configured_targets()``, checked as the API checks them); FileError names the entry
    and field. An entry marked ``invalid`` is a row as stored: only checked for what its columns
    can hold (on ``database``: ``postgresql``, ``sqlite`` or ``mysql``, when given)."""
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, Any]] = set()
    for i, raw in enumerate(entries, start=1):
        name = raw.get("name") if isinstance(raw, dict) else None
        where = f"{source}: entry {i}" + (f" ({name!r})" if isinstance(name, str) else "")
        try:
            if isinstance(raw, dict) and as_stored.MARK in raw:
                entry = _validate_stored(raw)
                if database is not None:
                    as_stored.check_storable(entry, database)
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
    """An entry as the judge (:mod:`periodic_manager.schedules.judge`) judges a row; ConfigError
    names its first problem."""
    if not isinstance(raw, dict):
        raise ConfigError("entry", "must be a table/object of schedule fields")
    verdict = judge(raw, Deployment(max_payload_bytes, targets))
    if isinstance(verdict, list):
        raise verdict[0].error()
    return {**DEFAULTS, **raw, "anchor": verdict.anchor, "options": verdict.options}


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
        entry["anchor"] = anchor_of(entry["anchor"])
    for key in JSON_COLUMNS:
        if key in entry:
            as_stored.check_json_value(key, entry[key])
    return {**entry, as_stored.MARK: mark, as_stored.RAW: raws}


def dump(entries: list[dict[str, Any]], fmt: str, calendars: dict[str, Any] | None = None) -> str:
    """The file of ``entries`` (and ``calendars`` by name: then a table beside the list)."""
    doc: Any = {"calendars": calendars, "schedules": entries} if calendars else entries
    if fmt == "json":
        return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    if fmt == "yaml":
        import yaml

        return str(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    import tomli_w

    for entry in entries:
        if has_null(entry):
            raise FileError(
                f"schedule {entry.get('name')!r} holds a JSON null, which TOML cannot express; "
                "export as json or yaml"
            )
    try:
        return tomli_w.dumps(
            {"calendars": calendars, "schedules": entries} if calendars else {"schedules": entries}
        )
    except (TypeError, ValueError) as exc:
        raise FileError(f"cannot write TOML: {exc}; export as json or yaml") from None


def has_null(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, dict):
        return any(has_null(v) for v in value.values())
    if isinstance(value, list):
        return any(has_null(v) for v in value)
    return False
