"""The one exception of the cron engine.

``CronError`` is a :class:`periodic_manager.errors.ConfigError` (hence a ``ValueError``)
that also carries a machine-readable ``code``. The message always reads
``"<field>: <code>: <detail>"``, e.g. ``minute: out-of-range: 60 is outside 0-59``.
"""

from __future__ import annotations

from periodic_manager.errors import ConfigError

#: Reason codes of docs/cron.md §7, plus the schedule-level ones.
CODES = frozenset(
    {
        "syntax",
        "field-count",
        "out-of-range",
        "step-zero",
        "reversed-range",
        "empty-element",
        "unknown-name",
        "single-value-step",
        "unsupported-extension",
        "macro",
        "every-duration",
        "illegal-character",
        "never-fires",
        "unknown-zone",
        "naive-datetime",
    }
)


class CronError(ConfigError):
    """An invalid cron expression, zone or instant.

    ``field`` is the cron field (``minute``, ``hour``, ``day-of-month``, ``month``,
    ``day-of-week``), ``expression`` for whole-expression problems, ``every``,
    ``timezone``, ``after`` or ``anchor``; ``code`` is one of :data:`CODES`;
    ``detail`` is the human-readable specifics.
    """

    def __init__(self, field: str, code: str, detail: str = "") -> None:
        if code not in CODES:  # a programming error, not bad input
            raise AssertionError(f"unknown CronError code {code!r}")
        super().__init__(field, f"{code}: {detail}" if detail else code, code=code)
        self.code = code
        self.detail = detail


class NaiveDatetimeError(CronError, TypeError):
    """A naive datetime where an instant is needed (``after``, ``anchor``).

    Both a CronError (code ``naive-datetime``, as for any invalid input) and a TypeError, like
    the error for an ``after`` that is no datetime at all: callers that catch either see it.
    """
