"""Which partition a schedule belongs to: the one rule, used by the lease holders, the provider's
reads and the manager's hand-overs.

A schedule's partition is its row id modulo the number of partitions (the rows of
``pm_partitions``, chosen at ``migrate``). Ids are positive integers that are never reused, a
rename keeps them, a tombstone carries them, and ``id % n`` is the same number in Python, in
PostgreSQL and in SQLite, so every reader agrees without a lookup table.
:func:`periodic_manager.db.partitions.partition_sql` is this rule written in SQL (a test checks
both on each database).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

# Bounds of the partition count (PM_PARTITIONS); the migration and the settings check them.
DEFAULT_PARTITIONS = 64
MAX_PARTITIONS = 4096


def partition_of(schedule_id: int, count: int) -> int:
    """The partition of the schedule with row id ``schedule_id`` out of ``count``."""
    return schedule_id % count


def every_partition(partitions: Collection[int], count: int) -> bool:
    """Whether ``partitions`` (partitions out of ``count``, as leases hold them: each one below
    ``count``) are every partition: a manager alone. One test, no set of every partition built."""
    return count > 0 and len(partitions) >= count


def check_count(value: object, field: str = "PM_PARTITIONS") -> int:
    """``value`` as a partition count, or ValueError naming ``field`` and the reason."""
    try:
        count = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{field}: {value!r} is not a whole number") from None
    if not 1 <= count <= MAX_PARTITIONS:
        raise ValueError(f"{field}: {count} is out of range (1..{MAX_PARTITIONS})")
    return count


def ranges_text(partitions: Iterable[int]) -> str:
    """Partitions as compact ranges, ascending: ``0-21, 40`` ("" for none)."""
    runs: list[list[int]] = []
    for p in sorted(set(partitions)):
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
