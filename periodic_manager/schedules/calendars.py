"""Exclusion calendars: named sets of dates, and ``options.exclude``.

A calendar is data, stored by name in ``pm_calendars`` (written by the API, by ``import`` or by
plain SQL): either a list of dates (``{"dates": ["2026-12-24", ...]}``) or the public holidays of
a country, optionally of one of its subdivisions (``{"holidays": {"country": "DE", "subdiv":
"BY"}}``, from the ``holidays`` package, expanded to dates year by year as needed).

A schedule with ``options.exclude: ["name", ...]`` sends no slot whose local date, in the
schedule's own zone, is in any of the named calendars; the manager records such a slot as
``skipped`` with reason ``excluded``. Exclusion is part of the slot rule
(:mod:`periodic_manager.schedules.slots`, which asks :func:`excluded_by`): the engine, the
backfill and every preview apply it alike, so previews and managers agree. A name that names no calendar is a row error (``options.exclude``).

Everything here is pure: no I/O, no clock. :func:`check_spec` is the one judge of a calendar's
content (API, SQL rows, import); :func:`check_names` the option check of ``options.exclude``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo

from periodic_manager.errors import ConfigError

log = logging.getLogger(__name__)

FIELD = "options.exclude"
NAME_PATTERN = "[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
NAME_RE = re.compile(rf"^{NAME_PATTERN}\Z")
NAME_RULE = "1-64 characters: letters, digits, '_', '.', '-', starting with a letter or digit"
MAX_NAMES = 20  # calendars one schedule may name
MAX_DATES = 10_000  # dates one calendar may list
# Years a holidays calendar is expanded for: a slot outside them is never excluded by it.
YEAR_MIN, YEAR_MAX = 1900, 2200
MAX_TEXT = 200_000  # the stored text of one calendar, before it is parsed


def check_name(value: Any, field_name: str = "name") -> str:
    """A calendar's name; ConfigError names ``field_name`` otherwise."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        shown = value[:70] if isinstance(value, str) else type(value).__name__
        raise ConfigError(field_name, f"must be a calendar name ({NAME_RULE}); got {shown!r}")
    return value


def check_names(value: Any) -> None:
    """The option check of ``options.exclude``: a list of 1 to MAX_NAMES distinct names."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_NAMES:
        raise ValueError(f"must be a list of 1 to {MAX_NAMES} calendar names")
    for i, name in enumerate(value):
        check_name(name, f"{FIELD}[{i}]")
    if len(set(value)) != len(value):
        raise ValueError("names a calendar twice")


@dataclass(frozen=True, slots=True)
class CalendarSpec:
    """A calendar's checked content: its dates, or the country (and subdivision) of its
    holidays. ``text`` is its canonical JSON, as stored and hashed."""

    dates: frozenset[date] | None
    country: str | None
    subdiv: str | None
    text: str

    @property
    def kind(self) -> str:
        return "dates" if self.dates is not None else "holidays"

    def as_json(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.text)
        return value


def _parse_date(value: Any, where: str) -> date:
    if not isinstance(value, str) or len(value) != 10 or not value.isascii():
        raise ConfigError(where, f"must be a date as YYYY-MM-DD (got {str(value)[:40]!r})")
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ConfigError(where, f"must be a valid date as YYYY-MM-DD (got {value!r})") from None


def check_spec(value: Any) -> CalendarSpec:
    """The one judge of a calendar's content (a parsed JSON value); ConfigError names the field
    (``dates``, ``dates[3]``, ``holidays.country``, ...)."""
    if (
        not isinstance(value, Mapping)
        or len(value) != 1
        or not ("dates" in value or "holidays" in value)
    ):
        raise ConfigError(
            "calendar", 'must be an object with one key: "dates" (a list) or "holidays" (an object)'
        )
    if "dates" in value:
        items = value["dates"]
        if not isinstance(items, list) or len(items) > MAX_DATES:
            raise ConfigError("dates", f"must be a list of at most {MAX_DATES} dates")
        dates = frozenset(_parse_date(v, f"dates[{i}]") for i, v in enumerate(items))
        text = _canonical({"dates": sorted(d.isoformat() for d in dates)})
        return CalendarSpec(dates, None, None, text)
    spec = value["holidays"]
    if not isinstance(spec, Mapping) or not set(spec) <= {"country", "subdiv"}:
        raise ConfigError("holidays", 'must be an object with "country" and optionally "subdiv"')
    country, subdiv = spec.get("country"), spec.get("subdiv")
    if not isinstance(country, str) or not country.isascii() or not 2 <= len(country) <= 3:
        raise ConfigError("holidays.country", "must be an ISO 3166 country code such as 'DE'")
    if subdiv is not None and (not isinstance(subdiv, str) or not 1 <= len(subdiv) <= 10):
        raise ConfigError("holidays.subdiv", "must be a subdivision code such as 'BY'")
    _check_holidays(country, subdiv)
    doc: dict[str, Any] = {"country": country}
    if subdiv is not None:
        doc["subdiv"] = subdiv
    return CalendarSpec(None, country, subdiv, _canonical({"holidays": doc}))


def _check_holidays(country: str, subdiv: str | None) -> None:
    import holidays

    supported = holidays.list_supported_countries()
    if country not in supported:
        raise ConfigError(
            "holidays.country", f"{country!r} is not a country the holidays package knows"
        )
    if subdiv is not None and subdiv not in supported[country]:
        known = ", ".join(supported[country][:40]) or "none"
        raise ConfigError(
            "holidays.subdiv", f"{subdiv!r} is not a subdivision of {country} (known: {known})"
        )


@lru_cache(maxsize=4096)
def holiday_dates(country: str, subdiv: str | None, year: int) -> frozenset[date]:
    """The public holidays of ``country`` (and ``subdiv``) in ``year`` (cached per triple);
    none outside YEAR_MIN..YEAR_MAX, and none (logged once) if the package fails for that year:
    a slot is then sent rather than a scheduler's loop stopped."""
    import holidays

    if not YEAR_MIN <= year <= YEAR_MAX:
        return frozenset()
    try:
        return frozenset(holidays.country_holidays(country, subdiv=subdiv, years=year))
    except Exception:  # the package's answer is not ours to trust with the loop
        log.exception(
            "holidays of %s%s in %d could not be computed",
            country,
            f"-{subdiv}" if subdiv else "",
            year,
        )
        return frozenset()


def parse_stored(text: Any) -> CalendarSpec:
    """A calendar's stored text (untrusted: SQL may have written it), judged; ConfigError.
    Texts are judged once (a manager reads every calendar at each sync that finds changes)."""
    if isinstance(text, str) and len(text) <= MAX_TEXT:
        return _parse_text(text)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError("calendar", "stored text is not valid UTF-8") from None
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise ConfigError(
            "calendar", f"stored text must be JSON text of at most {MAX_TEXT} characters"
        )
    return _parse_text(text)


@lru_cache(maxsize=1024)
def _parse_text(text: str) -> CalendarSpec:
    """A stored text judged (a ConfigError is not remembered: judged again each time)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise ConfigError("calendar", "stored text is not valid JSON") from None
    return check_spec(value)


@dataclass(frozen=True, slots=True)
class Exclusion:
    """The calendars a schedule's ``options.exclude`` names, resolved: what decides whether a
    slot is sent. ``digest`` covers their names and contents (part of the content hash, so a
    calendar edit replaces exactly the entries that name it)."""

    names: tuple[str, ...]
    specs: tuple[CalendarSpec, ...]
    digest: str

    def which(self, day: date) -> str | None:
        """The first calendar (by its place in ``options.exclude``) that holds ``day``, or None."""
        for name, s in zip(self.names, self.specs, strict=True):
            if s.dates is not None:
                if day in s.dates:
                    return name
            elif s.country is not None and day in holiday_dates(s.country, s.subdiv, day.year):
                return name
        return None


def exclusion(names: Sequence[str], calendars: Mapping[str, CalendarSpec]) -> Exclusion:
    """The exclusion of ``names`` (checked names); ConfigError naming ``options.exclude`` when
    one names no calendar in ``calendars``."""
    specs: list[CalendarSpec] = []
    for name in names:
        spec = calendars.get(name)
        if spec is None:
            raise ConfigError(
                FIELD, f"no calendar named {name!r} (create it with PUT /calendars/{name})"
            )
        specs.append(spec)
    return _exclusion(tuple(names), tuple(specs))


@lru_cache(maxsize=1024)
def _exclusion(names: tuple[str, ...], specs: tuple[CalendarSpec, ...]) -> Exclusion:
    """One shared Exclusion per (names, contents): a million rows naming one calendar share it."""
    doc = "\x1f".join(f"{n}\x1e{s.text}" for n, s in zip(names, specs, strict=True))
    return Exclusion(names, specs, hashlib.sha256(doc.encode()).hexdigest())


def excluded_by(exclusion: Exclusion | None, slot: datetime, zone: str) -> str | None:
    """The calendar that excludes ``slot`` (aware; its local date in ``zone``), or None."""
    if exclusion is None:
        return None
    return exclusion.which(slot.astimezone(_zone(zone)).date())


def skip_reason(slot: datetime, zone: str, name: str) -> str:
    """What run history says of a slot excluded by calendar ``name``."""
    return f"excluded: {slot.astimezone(_zone(zone)).date()} is in calendar {name!r}"


@lru_cache(maxsize=1024)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)  # a schedule's zone, checked by its judge before any slot


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
