"""Change signal by polling: for MariaDB/MySQL, which have no LISTEN/NOTIFY.

The triggers of migration 0003 give every write of ``periodic_jobs`` a fresh revision from one
counter (and every DELETE a tombstone), so the watermark (:func:`periodic_manager.db.changes
.peek`: one indexed query, handed in by ``assemble.py``; with the oldest row's revision,
which a TRUNCATE moves, as it fires no trigger) moves exactly when something changed. The poller reads
it every ``interval`` seconds (``PM_POLL_INTERVAL``, default 1 s) and asks for a sync when it
moved: a plain-SQL edit is live within about ``interval`` plus the sync. When nothing changed a
poll costs that one query; the sync then reads only the rows written since.

A failed poll is logged once (until one succeeds again); the first poll that succeeds after a
failure asks for a sync, since anything may have changed meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from periodic_manager.clock import SystemClock
from periodic_manager.contracts import Clock
from periodic_manager.errors import cause
from periodic_manager.runtime.tasks import SignalLoop, reraise_if_cancelled

if TYPE_CHECKING:
    from periodic_manager.db.changes import Watermark

log = logging.getLogger(__name__)


class RevisionPoller(SignalLoop):
    """A :class:`~periodic_manager.contracts.ChangeSignal` calling ``on_change(None)`` whenever the
    watermark of ``periodic_jobs`` (``read()``) moved since the last poll."""

    name = "poller"

    def __init__(
        self,
        read: Callable[[], Awaitable[Watermark]],
        *,
        interval: float = 1.0,
        clock: Clock | None = None,
        timeout: float = 5.0,
    ) -> None:
        if interval <= 0:
            raise ValueError("poll interval must be > 0")
        super().__init__(timeout)
        self.read = read
        self.interval = interval
        # Polls wait for the database's changes, not for a slot: real time even under a virtual
        # scheduler clock (as the PostgreSQL listener's reconnects).
        self.clock: Clock = clock or SystemClock()
        self.polls = 0  # polls that answered

    async def poll(self) -> Watermark:
        """The watermark now (one indexed query)."""
        return await asyncio.wait_for(self.read(), self.timeout)

    async def _run(self) -> None:
        seen: Watermark | None = None  # None: unknown (first poll, or after a failure)
        first, failing = True, False
        while True:
            try:
                revision = await self.poll()
            except Exception as exc:  # noqa: BLE001 - keep polling; the sync loop is the backstop
                reraise_if_cancelled(exc)
                if not failing:
                    log.warning(
                        "polling periodic_jobs for changes failed (retrying): %s", cause(exc)
                    )
                failing, seen = True, None
            else:
                self.polls += 1
                if failing:
                    log.info("polling periodic_jobs for changes works again")
                # The first poll of all needs no sync (the manager syncs as it starts); a poll
                # after a failure does, as does any move of the revision.
                if revision != seen and not first:
                    self.on_change(None)  # a revision says nothing of partitions
                first, failing, seen = False, False, revision
            await self.clock.sleep(self.interval)
