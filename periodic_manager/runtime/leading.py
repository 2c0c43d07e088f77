"""What a change of leadership does to the scheduler.

* Leading from the start: sending starts at once, and nothing old is sent (the entries' first
  slots are after their registration), except the latest missed slot of each ``fire_once``
  schedule (:mod:`periodic_manager.engine.catchup`).
* Taking over from another leader: the store is asked for the latest slot it records as settled
  for each schedule; then every entry resumes at its first slot after ``now - grace`` that is
  after that slot (and after the schedule's ``effective_at``): slots the old leader may have
  missed within grace are sent, none it settled is sent again, even when the broker's claims are
  gone. Nothing is sent until the settled slots are known (a failed read is retried while this
  term of leadership lasts). The read happens off the leadership check.
* Losing leadership: sending stops at once (a staged batch is put back, held slots dropped).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any

from periodic_manager.contracts import Clock, Leadership, RuntimeStore
from periodic_manager.engine import catchup
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.runtime.tasks import reraise_if_cancelled
from periodic_manager.schedules.definition import ident_of

log = logging.getLogger(__name__)

# How often a takeover tries again to read what the database records as settled.
SETTLED_RETRY_S = 1.0
Spawn = Callable[[Coroutine[Any, Any, Any], str], None]


class Leading:
    """Follows ``leadership`` for one manager (its :meth:`changed` is the leadership callback)."""

    def __init__(
        self,
        scheduler: Scheduler,
        store: RuntimeStore,
        leadership: Leadership,
        *,
        clock: Clock,
        manager_id: str,
        spawn: Spawn,
        running: Callable[[], bool],
        changed: Callable[[], None],
    ) -> None:
        self.scheduler = scheduler
        self.store = store
        self.leadership = leadership
        self.clock = clock
        self.manager_id = manager_id
        self._spawn = spawn
        self._running = running  # started (a leadership won now is a takeover)
        self._changed = changed  # called after every change (the heartbeat tells at once)
        self._terms = 0  # counts leadership changes: a takeover still reading belongs to its term

    def changed(self, is_leader: bool) -> None:
        now = self.clock.now()
        self._terms += 1
        if is_leader and self._running():
            self._spawn(self._take_over(now, self._terms), "takeover")
        elif is_leader:
            self.scheduler.set_active(True)
            log.info("manager %s leads (start)", self.manager_id)
            self._spawn(self._catch_up(now, takeover=False), "catch-up")
        else:
            self.scheduler.set_active(False)
            log.info("manager %s is standby", self.manager_id)
        self._changed()

    async def _take_over(self, now: datetime, term: int) -> None:
        since = now - self.scheduler.grace
        settled = await self._settled_after(since, term)
        if settled is None:
            return  # no longer leading: the next term decides
        self.scheduler.set_active(True, resume_after=since, settled=settled)
        log.info("manager %s leads (takeover)", self.manager_id)
        await self._catch_up(now, takeover=True)

    async def _settled_after(self, since: datetime, term: int) -> dict[int | str, datetime] | None:
        """What the store records as settled after ``since``, by ident, each capped at now (a
        value from the future only means nothing in the past may be sent). Retried while this
        term lasts; None once it ended."""
        failed = False
        while term == self._terms:
            try:
                rows = await self.store.settled_after(since)
            except Exception as exc:
                reraise_if_cancelled(exc)
                if not failed:
                    log.error(
                        "takeover waits: cannot read the settled slots (%s: %s); nothing is "
                        "sent until they are known", type(exc).__name__, exc,
                    )  # fmt: skip
                failed = True
                await self.clock.sleep(SETTLED_RETRY_S)
                continue
            if term != self._terms:
                break  # leadership changed during the read
            if failed:
                log.info("takeover: settled slots read")
            now = self.clock.now()
            settled: dict[int | str, datetime] = {}
            shared: dict[datetime, datetime] = {}  # a burst settles many schedules at one slot
            for key, at in rows.items():
                at = min(at, now)
                settled[ident_of(key)] = shared.setdefault(at, at)
            return settled
        return None

    async def _catch_up(self, now: datetime, *, takeover: bool) -> None:
        """misfire=fire_once: send the latest missed slot within the catch-up window, once."""
        await catchup.catch_up(
            self.scheduler, self.store, now, takeover=takeover,
            still_leading=lambda: self.leadership.is_leader,
        )  # fmt: skip
