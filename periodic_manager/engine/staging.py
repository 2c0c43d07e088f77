"""Staging: the work of the next instant, done before it.

``lead`` seconds before an instant (in proportion to its size, from the measured cost per task)
the stager takes the instant's entries off the timetable, builds their tasks and lets the target
prepare them (:func:`periodic_manager.engine.dispatch.prepare`); at the instant the scheduler only sends.
Cyclic garbage collection waits from staging until the batch is sent. The batch remembers the
scheduler's change counter: if an entry was registered, replaced or removed meanwhile, the
scheduler re-checks the batch at the slot (a staged entry that died is dropped, its replacement
comes from the timetable).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from periodic_manager import gcpolicy
from periodic_manager.contracts import StagedTarget
from periodic_manager.engine.dispatch import Chunk, prepare
from periodic_manager.engine.timetable import Timetable

if TYPE_CHECKING:
    from periodic_manager.engine.entry import ScheduledEntry
    from periodic_manager.schedules.definition import PeriodicTaskConfig

# Staging starts LEAD_MIN_S + 1.5 x (tasks x measured cost per task) before an instant, at most
# LEAD_MAX_S: early enough for its size, late enough that few entries change in between.
LEAD_MIN_S = 0.02
LEAD_MAX_S = 10.0
STAGE_COST_S = 40e-6  # first guess of staging time per task; then measured


@dataclass(slots=True)
class Staged:
    """An instant's batch, made ready before the instant."""

    slot: datetime
    entries: list[ScheduledEntry]
    chunks: list[Chunk]
    changes: int  # the scheduler's change counter when staged (-1: check every entry at the slot)


class Stager:
    """Holds at most one staged batch: the next instant's."""

    def __init__(
        self,
        timetable: Timetable,
        target: StagedTarget,
        window: Callable[[PeriodicTaskConfig], timedelta],
        changes: Callable[[], int],
    ) -> None:
        self._timetable = timetable
        self._target = target
        self._window = window
        self._changes = changes  # the scheduler's change counter
        self.staged: Staged | None = None
        self._gc_hold: contextlib.ExitStack | None = None
        self._cost = STAGE_COST_S

    def lead(self, size: int) -> float:
        """Seconds before an instant of ``size`` tasks that its staging starts."""
        return min(LEAD_MAX_S, LEAD_MIN_S + 1.5 * size * self._cost)

    def wake_at(self) -> datetime | None:
        """The staged instant, or the time to stage the next one (if nothing is staged)."""
        at = self._timetable.next_instant()
        if self.staged is None:
            if at is not None:
                at -= timedelta(seconds=self.lead(self._timetable.size(at)))
            return at
        if at is None or self.staged.slot < at:
            return self.staged.slot
        return at

    async def maybe_stage(self, now: datetime) -> None:
        """Stage the next instant if its time to be staged has come."""
        if self.staged is not None:
            return
        at = self._timetable.next_instant()
        if at is None or now < at - timedelta(seconds=self.lead(self._timetable.size(at))):
            return
        entries: list[ScheduledEntry] = self._timetable.take(at)  # type: ignore[assignment]
        if not entries:
            return
        changes = self._changes()
        if any(e.fired is not None and at <= e.fired for e in entries):
            changes = -1  # some already sent (the clock stepped back): sort them out at the slot
        elif any(e.exclusion is not None for e in entries):
            changes = -1  # options.exclude: the slot's date is looked at, at the slot
        hold = contextlib.ExitStack()
        hold.enter_context(gcpolicy.paused())  # until the batch is sent
        started = time.process_time()  # a cost estimate for the lead, not a scheduling decision
        chunks = await prepare(self._target, at, entries, self._window)
        took = time.process_time() - started
        self._cost = 0.7 * self._cost + 0.3 * took / len(entries)
        if self._changes() != changes:
            changes = -1  # entries changed while staging (it yields)
        self.staged, self._gc_hold = Staged(at, entries, chunks, changes), hold

    def unstage(self) -> None:
        """Put a staged batch's entries back on the timetable (leadership lost, rebase, stop)."""
        batch, self.staged = self.staged, None
        if batch is not None:
            for entry in batch.entries:
                if not entry.dead and entry.next_slot == batch.slot:
                    self._timetable.add(entry, batch.slot)
        self.release_gc()

    def release_gc(self) -> None:
        """Let garbage collection run again (the staged batch was sent or dropped)."""
        hold, self._gc_hold = self._gc_hold, None
        if hold is not None:
            hold.close()
