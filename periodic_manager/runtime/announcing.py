"""Announcing this manager's entries to a target's own tools
(:class:`~periodic_manager.contracts.EntryAnnouncer`: asynq's scheduler entries, which
``asynq cron ls`` and asynqmon list).

For visibility only, as :mod:`~periodic_manager.runtime.publishing` is for the API: every
``announce_every_s`` the entries are announced while this manager sends (none while it does not:
a standby's announcement is withdrawn), a failure is logged and the next round tries again, and
a stop withdraws them. A deployment with more entries than ``announce_max`` announces that many
of them (the first registered), in order of name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from itertools import islice
from typing import TYPE_CHECKING

from periodic_manager.contracts import AnnouncedEntry, Clock, EntryAnnouncer
from periodic_manager.errors import cause
from periodic_manager.runtime.tasks import reraise_if_cancelled

if TYPE_CHECKING:
    from periodic_manager.engine.entry import ScheduledEntry

log = logging.getLogger(__name__)


def announced(entry: ScheduledEntry) -> AnnouncedEntry:
    """``entry`` as announced: its last slot is the last one this manager handled."""
    return AnnouncedEntry(
        entry.name,
        entry.spec,
        entry.timezone,
        entry.task_type,
        entry.payload_json,
        entry.options,
        entry.next_slot,
        entry.fired,
    )


class Announcer:
    """Announces the entries of ``entries()`` (the scheduler's own map, read, never copied
    whole) to ``target`` while ``sending()``."""

    def __init__(
        self,
        target: EntryAnnouncer,
        manager_id: str,
        clock: Clock,
        entries: Callable[[], Mapping[int | str, ScheduledEntry]],
        sending: Callable[[], bool],
    ) -> None:
        self.target = target
        self.manager_id = manager_id
        self.clock = clock
        self.entries = entries
        self.sending = sending

    async def run(self) -> None:
        while True:
            await self.once()
            await self.clock.sleep(self.target.announce_every_s)

    async def once(self) -> None:
        """One announcement (the entries, or none while this manager does not send)."""
        # The first registered (no copy nor sort of a million entries every round), by name.
        held = self.entries().values() if self.sending() else ()
        chosen = sorted(islice(held, self.target.announce_max), key=lambda e: e.name)
        try:
            await self.target.announce(
                self.manager_id, [announced(e) for e in chosen], self.clock.now()
            )
        except Exception as exc:  # for visibility only: scheduling goes on without it
            reraise_if_cancelled(exc)
            log.warning("announcing entries failed (again in the next round): %s", cause(exc))

    async def withdraw(self) -> None:
        """Remove this manager's announcement (a stop); a failure is logged, and the
        announcement then expires by itself."""
        try:
            await self.target.withdraw(self.manager_id)
        except Exception as exc:
            reraise_if_cancelled(exc)
            log.warning("withdrawing announced entries failed (they expire): %s", cause(exc))
