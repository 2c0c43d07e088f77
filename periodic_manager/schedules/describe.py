"""Human-readable descriptions of schedules, for previews (API ``/cron/next``, CLI ``next``).

Cron expressions are described by ``cron-descriptor``; macros are described as their expansion
and ``@every`` here. That library reads day-of-month/day-of-week with the plain OR rule and
phrases steps as regular intervals, which is not always what our dialect does
(``docs/cron.md``), so :func:`describe` returns None rather than a misleading
sentence when:

* one day field starts with ``*`` but is a step (``*/2``) and the other is restricted: Vixie
  cron (and we) then AND the two fields, while the library says "or";
* a step does not tile its field (``*/25`` minutes fires at :00, :25, :50 and again at :00 — not
  "every 25 minutes"; any step over days of the month; a step larger than its range);
* day of week ``0-7`` (the library says "Sunday through Sunday").

The expression must already be valid (parse it first); anything the library cannot describe
also yields None.
"""

from __future__ import annotations

import re

from periodic_manager.cron.parser import MACROS  # one table of macros for the whole package

# Length of each field's cycle, for "does this step tile the field"; None: never (days of month).
CYCLES: tuple[int | None, ...] = (60, 24, None, 12, 7)
UNITS = {"d": "day", "h": "hour", "m": "minute", "s": "second"}
_EVERY = re.compile(r"([0-9]+)([dhms])")
_RANGE = re.compile(r"^([0-9]+)-([0-9]+)$")


def describe(spec: str) -> str | None:
    """An English description of a valid ``spec``, or None (see the module docstring)."""
    text = spec.strip()
    lowered = text.lower()
    if lowered.startswith("@every"):
        return _describe_every(lowered[len("@every") :])
    text = MACROS.get(lowered, text)
    fields = text.split()
    if len(fields) != 5 or not _faithful(fields):
        return None
    try:
        from cron_descriptor import ExpressionDescriptor, Options

        options = Options()
        options.use_24hour_time_format = True
        return str(ExpressionDescriptor(" ".join(fields), options).get_description())
    except Exception:  # the library's own limits: no description rather than an error
        return None


def _describe_every(duration: str) -> str | None:
    parts = [(int(n), UNITS[u]) for n, u in _EVERY.findall(duration)]
    parts = [(n, unit) for n, unit in parts if n]
    if not parts:
        return None
    words = [f"{n} {unit}{'s' if n != 1 else ''}" for n, unit in parts]
    return "Every " + (", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0])


def _faithful(fields: list[str]) -> bool:
    dom, dow = fields[2], fields[4]
    if dom != "*" and dow != "*" and (dom.startswith("*") or dow.startswith("*")):
        return False  # Vixie AND, described as OR by the library
    for value, cycle in zip(fields, CYCLES, strict=True):
        for element in value.split(","):
            base, _, step = element.partition("/")
            if not step or int(step) == 1:
                continue
            n = int(step)
            if base == "*":
                if cycle is None or cycle % n:
                    return False
            else:
                bounds = _RANGE.match(base)
                if bounds is None or n > int(bounds.group(2)) - int(bounds.group(1)):
                    return False
    return all(element.split("/")[0] != "0-7" for element in dow.split(","))
