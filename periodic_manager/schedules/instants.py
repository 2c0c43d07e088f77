"""The one text of an instant in keys and messages (UTC ISO with ``Z``).

A leaf module: the definition (idempotency keys), jitter (its hash), the targets and the API all
write instants this way, and none of them needs the rest of a schedule's definition for it.
"""

from __future__ import annotations

from datetime import datetime

from periodic_manager import cron


def slot_text(slot: datetime) -> str:
    """An instant as UTC ISO text with ``Z``: ``2024-03-31T01:30:00Z`` (microseconds if any).

    The one format of every instant in keys and messages. A naive datetime is refused.
    """
    if slot.tzinfo is None or slot.utcoffset() is None:
        raise ValueError(f"naive datetime {slot!r}; pass an aware instant")
    utc = slot.astimezone(cron.UTC)
    text = utc.isoformat(timespec="microseconds" if utc.microsecond else "seconds")
    return text.replace("+00:00", "Z")
