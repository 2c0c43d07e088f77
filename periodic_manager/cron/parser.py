"""Cron expression grammar: text -> :class:`CronSpec` or :class:`EverySpec`.

Implements docs/cron.md §2-§7 and §10. Every rejected form raises
:class:`~periodic_manager.cron.errors.CronError` with the field and a reason code.
Parsing is zone-independent; binding to a zone happens in ``schedule.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from periodic_manager.cron.errors import CronError

# §2: printable ASCII, space and tab only. A regex on explicit ranges, because
# str.isdigit()/isprintable() accept Unicode digits and other look-alikes.
_LEGAL = re.compile(r"[\t\x20-\x7e]*")
_BLANKS = re.compile(r"[ \t]+")
_ELEMENT = re.compile(r"(\*|[0-9a-z]+)(?:-([0-9a-z]+))?(?:/([0-9a-z]+))?")
_NUMBER = re.compile(r"[0-9]+")
_WORD = re.compile(r"[a-z]+")
# Quartz/Jenkins extensions (L, W, LW, nL, nW, H) get their own reason code.
_EXTENSION_TOKEN = re.compile(r"[0-9]*(?:l|w|lw)|h")
_DURATION = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")

MONTH_NAMES = {
    n: i + 1 for i, n in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())
}
DOW_NAMES = {n: i for i, n in enumerate("sun mon tue wed thu fri sat".split())}

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# Longest length of each month (February counts 29): the never-fires closed form (§7).
_MAX_MONTH_LEN = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
# A duration beyond timedelta's range cannot produce a representable instant.
_MAX_PERIOD_S = 999_999_999 * 86_400
# Numbers longer than this (after leading zeros) are beyond every bound here; converting them
# is pointless, and beyond 4,300 digits Python's int() refuses them with a ValueError.
_MAX_DIGITS = 18
_HUGE: int = 10**_MAX_DIGITS


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    lo: int
    hi: int
    names: dict[str, int] | None


FIELDS = (
    _Field("minute", 0, 59, None),
    _Field("hour", 0, 23, None),
    _Field("day-of-month", 1, 31, None),
    _Field("month", 1, 12, MONTH_NAMES),
    _Field("day-of-week", 0, 7, DOW_NAMES),
)


@dataclass(frozen=True, slots=True)
class CronSpec:
    """A parsed five-field expression: sorted value sets plus the ``*``-prefix flags.

    ``dows`` uses 0 = Sunday (7 already folded onto 0). ``dom_star``/``dow_star``
    select the Vixie day rule (§6); ``hour_star`` the DST class (§8.1).
    """

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    doms: tuple[int, ...]
    months: tuple[int, ...]
    dows: tuple[int, ...]
    dom_star: bool
    dow_star: bool
    hour_star: bool

    @property
    def day_and(self) -> bool:
        """True when the day rule is AND (either day field starts with ``*``)."""
        return self.dom_star or self.dow_star

    @property
    def fixed_hour(self) -> bool:
        """True for the fixed-hour DST class: the hour field does not start with ``*``."""
        return not self.hour_star


@dataclass(frozen=True, slots=True)
class EverySpec:
    """``@every <duration>``: an elapsed-time grid of ``period_us`` microseconds."""

    text: str
    period_us: int


def parse_spec(expr: str) -> CronSpec | EverySpec:
    """Parse and validate ``expr``; raise :class:`CronError` naming the field and reason."""
    if not isinstance(expr, str):
        raise CronError("expression", "syntax", f"must be a string, not {type(expr).__name__}")
    if not _LEGAL.fullmatch(expr):
        bad = next(c for c in expr if not _LEGAL.fullmatch(c))
        pos = expr.index(bad)
        raise CronError(
            "expression",
            "illegal-character",
            f"U+{ord(bad):04X} at position {pos}; only printable ASCII, spaces and tabs are allowed",
        )
    text = expr.strip(" \t").lower()
    if not text:
        raise CronError("expression", "syntax", "the expression is empty")
    tokens = _BLANKS.split(text)
    if text.startswith("@"):
        if tokens[0].startswith("@every"):
            return _parse_every(expr, tokens)
        return _parse_fields(expr, _expand_macro(tokens))
    return _parse_fields(expr, tokens)


def _expand_macro(tokens: list[str]) -> list[str]:
    macro = tokens[0]
    if macro == "@reboot":
        raise CronError("expression", "macro", "@reboot is not supported")
    if macro not in MACROS:
        raise CronError(
            "expression", "macro", f"unknown macro {macro!r}; expected one of {', '.join(MACROS)}"
        )
    if len(tokens) > 1:
        raise CronError(
            "expression", "macro", f"{macro} must stand alone, got {' '.join(tokens)!r}"
        )
    return MACROS[macro].split(" ")


def _parse_every(expr: str, tokens: list[str]) -> EverySpec:
    if tokens[0] != "@every":
        raise CronError("every", "every-duration", "expected a blank after @every")
    if len(tokens) != 2:
        got = "nothing" if len(tokens) == 1 else repr(" ".join(tokens[1:]))
        raise CronError(
            "every", "every-duration", f"expected exactly one duration like 1h30m, got {got}"
        )
    m = _DURATION.fullmatch(tokens[1])
    if not tokens[1] or m is None:
        raise CronError(
            "every",
            "every-duration",
            f"{tokens[1]!r} is not a duration: integers with units d, h, m, s in that order",
        )
    d, h, mi, s = (_int(g) if g is not None else 0 for g in m.groups())
    total = ((d * 24 + h) * 60 + mi) * 60 + s
    if total < 1:
        raise CronError("every", "every-duration", "the duration must be at least 1s")
    if total > _MAX_PERIOD_S:
        raise CronError("every", "every-duration", "the duration is too long")
    return EverySpec(expr, total * 1_000_000)


def _parse_fields(expr: str, tokens: list[str]) -> CronSpec:
    if len(tokens) != 5:
        hint = " (seconds and year fields are not supported)" if len(tokens) in (6, 7) else ""
        raise CronError("expression", "field-count", f"{len(tokens)} fields, expected 5{hint}")
    sets = [_parse_field(f, t) for f, t in zip(FIELDS, tokens, strict=True)]
    spec = CronSpec(
        text=expr,
        minutes=_interned(sets[0]),
        hours=_interned(sets[1]),
        doms=_interned(sets[2]),
        months=_interned(sets[3]),
        dows=_interned({v % 7 for v in sets[4]}),
        dom_star=tokens[2].startswith("*"),
        dow_star=tokens[4].startswith("*"),
        hour_star=tokens[1].startswith("*"),
    )
    _check_fires(spec)
    return spec


# Field value tuples, one object per distinct set: a million expressions repeat a few (`*` alone
# is 31 days, 12 months, 7 weekdays).
_VALUE_SETS: dict[tuple[int, ...], tuple[int, ...]] = {}
_VALUE_SETS_MAX = 16_384


def _interned(values: Iterable[int]) -> tuple[int, ...]:
    key = tuple(sorted(values))
    got = _VALUE_SETS.get(key)
    if got is None:
        if len(_VALUE_SETS) >= _VALUE_SETS_MAX:
            _VALUE_SETS.clear()
        got = _VALUE_SETS[key] = key
    return got


def _check_fires(spec: CronSpec) -> None:
    """Reject expressions no calendar date matches (§7, closed form).

    Under OR every month contains every weekday, so the expression fires. Under AND
    a (month, day) pair that exists in some year is enough: over the 400-year cycle
    every existing date, Feb 29 included, falls on every weekday.
    """
    if not spec.day_and:
        return
    if any(d <= _MAX_MONTH_LEN[m] for m in spec.months for d in spec.doms):
        return
    raise CronError(
        "expression",
        "never-fires",
        f"no selected month has a day {','.join(map(str, spec.doms))}; the schedule would never fire",
    )


def _parse_field(field: _Field, text: str) -> set[int]:
    values: set[int] = set()
    for element in text.split(","):
        if not element:
            raise CronError(field.name, "empty-element", f"empty list element in {text!r}")
        values.update(_parse_element(field, element))
    return values


def _parse_element(field: _Field, element: str) -> range:
    if "#" in element or "?" in element or element.startswith("h("):
        raise CronError(
            field.name, "unsupported-extension", f"{element!r}: L, W, #, ? and H are not supported"
        )
    m = _ELEMENT.fullmatch(element)
    if m is None:
        raise CronError(field.name, "syntax", f"{element!r} is not a value, range or step")
    first, last, step = m.groups()
    if first == "*":
        if last is not None:
            raise CronError(field.name, "syntax", f"{element!r}: '*' cannot start a range")
        lo, hi = field.lo, field.hi
    else:
        lo = _value(field, first)
        if last is None:
            if step is not None:
                raise CronError(
                    field.name,
                    "single-value-step",
                    f"{element!r}: a step needs '*' or a range (write {first}-{field.hi}/{step})",
                )
            return range(lo, lo + 1)
        hi = _value(field, last)
        if lo > hi:
            raise CronError(
                field.name,
                "reversed-range",
                f"{element!r}: {lo} > {hi}; ranges do not wrap around",
            )
    n = 1
    if step is not None:
        if not _NUMBER.fullmatch(step):
            raise CronError(field.name, "syntax", f"{element!r}: the step must be a number")
        n = _int(step)
        if n == 0:
            raise CronError(field.name, "step-zero", f"{element!r}: the step must be at least 1")
    return range(lo, hi + 1, n)


def _int(digits: str) -> int:
    """An ASCII decimal number (leading zeros allowed); any number of more than ``_MAX_DIGITS``
    significant digits is ``_HUGE``, which every bound check then refuses."""
    significant = digits.lstrip("0")
    if len(significant) > _MAX_DIGITS:
        return _HUGE
    return int(significant or "0")


def _value(field: _Field, token: str) -> int:
    """A number or a name of ``field``; bounds are checked here, so every bound is checked."""
    if _NUMBER.fullmatch(token):
        value = _int(token)
        if not field.lo <= value <= field.hi:
            shown = value if value < _HUGE else f"a number of {len(token.lstrip('0'))} digits"
            raise CronError(field.name, "out-of-range", f"{shown} is outside {field.lo}-{field.hi}")
        return value
    if _EXTENSION_TOKEN.fullmatch(token):
        raise CronError(
            field.name, "unsupported-extension", f"{token!r}: L, W, #, ? and H are not supported"
        )
    if _WORD.fullmatch(token):
        if field.names is not None and token in field.names:
            return field.names[token]
        if field.names is not None or token[:3] in MONTH_NAMES or token[:3] in DOW_NAMES:
            if field.names is not None:
                names = list(field.names)
                hint = f"use the three-letter names {names[0]}...{names[-1]}"
            else:
                hint = "names are only allowed in the month and day-of-week fields"
            raise CronError(
                field.name, "unknown-name", f"{token!r} is not a {field.name} name; {hint}"
            )
    raise CronError(field.name, "syntax", f"{token!r} is not a decimal number")
