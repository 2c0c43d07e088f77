"""A registered schedule: its config and its timing in one object (the scheduler's entry).

A manager holds a million of these, so an entry is lean: it *is* its config (a provider builds
rows as fresh entries, which the scheduler adopts without a copy), instants are shared objects,
flags live in one integer (``mark``) or in the class (``synced``), and everything else (parsed
schedule, window, key, content hash, entry id) is derived when asked for.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from periodic_manager.engine.timetable import DEAD
from periodic_manager.schedules.definition import PeriodicTaskConfig, content_hash

__all__ = ["CodeEntry", "ScheduledEntry", "lookback_floor", "same_slots"]


class ScheduledEntry(PeriodicTaskConfig):
    """One registered schedule: its config and its timing, in one object. One per schedule key.

    Lean on purpose (a manager holds a million): the entry *is* its config (``config`` is the
    entry itself: a provider's fresh entry adopted as is, otherwise a copy of the config),
    instants are shared (one object per timetable instant and per sync chunk), and the parsed
    schedule, window, key, content hash and entry id are derived when needed.
    """

    __slots__ = (
        "registered_at",
        "next_slot",  # None: no slot left (past year 9999)
        "prev_slot",
        "last_error",
        # Slots of this entry are strictly after this instant, except a slot of the version it
        # replaced that was already due (carried over so an edit never drops it).
        "after",
        "fired",  # the latest slot this scheduler handled for the schedule
        # options.max_runs: scheduled slots this scheduler may still send (None: no limit);
        # one less for every slot sent; 0: no next slot (see periodic_manager/schedules/runs.py).
        "runs_left",
        # The timetable's per-take mark (an entry filed twice is taken once); DEAD once unregistered
        # or replaced (stale wherever the timetable still holds it); -1 while fresh.
        "mark",
    )
    # Owned by the sync (a row); entries registered from code are CodeEntry. A class attribute,
    # not a field: a million entries do not each carry it.
    synced = True

    registered_at: datetime
    next_slot: datetime | None
    prev_slot: datetime | None
    last_error: str | None
    after: datetime | None
    fired: datetime | None
    runs_left: int | None
    mark: int

    def _start(
        self,
        registered_at: datetime,
        next_slot: datetime | None,
        prev_slot: datetime | None,
        after: datetime | None,
        fired: datetime | None,
    ) -> ScheduledEntry:
        self.registered_at = registered_at
        self.next_slot = next_slot
        self.prev_slot = prev_slot
        self.last_error = None
        self.after = after
        self.fired = fired
        self.runs_left = None
        self.mark = 0
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As PeriodicTaskConfig: a provider builds rows as fresh entries (see ``of``)."""
        super().__init__(*args, **kwargs)
        self.mark = -1  # fresh: not registered yet

    def _fresh(self) -> None:
        self.mark = -1

    @property
    def fresh(self) -> bool:
        """Built as an entry by a provider but not registered yet (it can be adopted as is)."""
        return self.mark == -1

    @property
    def dead(self) -> bool:
        """Unregistered or replaced."""
        return self.mark == DEAD

    def kill(self) -> None:
        """Mark unregistered or replaced (for good: a new registration is a new entry)."""
        self.mark = DEAD

    @classmethod
    def of(
        cls,
        config: PeriodicTaskConfig,
        registered_at: datetime,
        next_slot: datetime | None = None,
        *,
        prev_slot: datetime | None = None,
        after: datetime | None = None,
        fired: datetime | None = None,
        synced: bool = False,
    ) -> ScheduledEntry:
        """The entry of ``config``: the object itself when a provider built it as a fresh entry
        (no copy per schedule), else a copy of its fields (a CodeEntry unless ``synced``)."""
        if synced and isinstance(config, cls) and type(config) is cls and config.fresh:
            entry: ScheduledEntry = config
        else:
            kind = cls if synced else CodeEntry
            entry = kind.__new__(kind)
            for name in _CONFIG_SLOTS:
                setattr(entry, name, getattr(config, name))
        return entry._start(registered_at, next_slot, prev_slot, after, fired)

    @property
    def config(self) -> PeriodicTaskConfig:
        return self

    def refresh(self, config: PeriodicTaskConfig) -> None:
        """Take the bookkeeping of a newer read of the same content (revision, effective_at)."""
        self.revision = config.revision
        self.effective_at = config.effective_at

    @property
    def entry_id(self) -> str:
        """Stable id of this version: the schedule key and its content hash."""
        return f"{self.key}-{content_hash(self)[:12]}"


class CodeEntry(ScheduledEntry):
    """An entry registered from code (``register``), not owned by the sync: no row removes it."""

    __slots__ = ()
    synced = False


_CONFIG_SLOTS = PeriodicTaskConfig.__slots__


def same_slots(a: PeriodicTaskConfig, b: PeriodicTaskConfig) -> bool:
    """Whether two versions of a schedule have the same slots and the same idempotency keys
    (bounds included: options.start_at and options.end_at, as written)."""
    return (a.spec, a.timezone, a.anchor, a.name) == (b.spec, b.timezone, b.anchor, b.name) and (
        _bounds_text(a) == _bounds_text(b)
    )


def _bounds_text(config: PeriodicTaskConfig) -> tuple[object, object]:
    opts = config.options
    if not opts:
        return (None, None)
    return (opts.get("start_at"), opts.get("end_at"))


def lookback_floor(config: PeriodicTaskConfig, now: datetime) -> datetime | None:
    """The instant a look back (takeover, catch-up) must stay strictly after, or None for none.

    The schedule's ``effective_at``, capped at ``now``: a value in the future (another clock, or a
    hand-written row) only means nothing in the past may be sent.
    """
    floor = config.effective_at
    if floor is None:
        return None
    return floor if floor < now else now
