"""What a change of leadership does to the scheduler.

* Leading from the start: sending starts at once, and nothing old is sent (the entries' first
  slots are after their registration), except the latest missed slot of each ``fire_once``
  schedule (:mod:`periodic_manager.engine.catchup`).
* Taking over from another leader: the store is asked for the latest slot it records as settled
  for each schedule; then every entry resumes at its first slot after ``now - grace`` (``now``:
  when that read began; a ``fire_once`` catch-up looks back from there too) that is
  after that slot (and after the schedule's ``effective_at``): slots the old leader may have
  missed within grace are sent, none it settled is sent again, even when the broker's claims are
  gone. Nothing is sent until the settled slots are known (a failed read is retried while this
  term of leadership lasts; a read failing for ``SETTLED_STALL_S`` makes the manager unhealthy,
  see :meth:`Leading.stalled`). The read happens off the leadership check. Schedules with
  ``options.max_runs`` take their runs left from the same read (runs counted and settled slot):
  a standby's own view of them is stale.
* Losing leadership: sending stops at once (a staged batch is put back, held slots dropped).
* By partitions (``partitioned``): leading only switches sending on and off; each partition
  taken is a takeover of its own (:meth:`Leading.take_over_some`, called by
  :class:`~periodic_manager.runtime.holding.PartitionHolding`): the same read of what is settled
  and the same look back, for the entries of that partition only, and never before a manager
  first held it (slots due earlier are owed by nobody).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any

from periodic_manager.contracts import Clock, Leadership, RuntimeStore
from periodic_manager.engine import catchup
from periodic_manager.engine.entries import Counted
from periodic_manager.engine.entry import ScheduledEntry
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.errors import cause
from periodic_manager.pacing import in_turns
from periodic_manager.runtime.limited import limited, read_counted
from periodic_manager.runtime.tasks import reraise_if_cancelled
from periodic_manager.schedules.definition import ident_of

log = logging.getLogger(__name__)

# How often a takeover tries again to read what the database records as settled.
SETTLED_RETRY_S = 1.0
# A takeover that has not read them for this long makes the manager unhealthy: it sends nothing.
SETTLED_STALL_S = 60.0
Spawn = Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]]


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
        partitioned: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.store = store
        self.leadership = leadership
        self.clock = clock
        self.manager_id = manager_id
        self._spawn = spawn
        self._running = running  # started (a leadership won now is a takeover)
        self._changed = changed  # called after every change (the heartbeat tells at once)
        self._partitioned = partitioned  # each partition taken is a takeover of its own
        self._terms = 0  # counts leadership changes: a takeover still reading belongs to its term
        # Since when the takeover of which term has failed to read the settled slots, and why.
        self._failing: tuple[int, datetime] | None = None
        self._failure = ""
        # Set unless a takeover is reading what the store records (set while it waits on the
        # clock to retry, and once it is active): what :meth:`settled` waits for.
        self._read = asyncio.Event()
        self._read.set()

    def changed(self, is_leader: bool) -> None:
        now = self.clock.now()
        self._terms += 1
        if self._partitioned:
            self.scheduler.set_active(is_leader)  # the entries are the partitions' (rebased each)
            log.info(
                "manager %s %s", self.manager_id, "holds partitions" if is_leader else "holds none"
            )
        elif is_leader and self._running():
            read = self._read = asyncio.Event()
            self._spawn(self._take_over(self._terms), "takeover").add_done_callback(
                lambda _: read.set()
            )
        elif is_leader:
            self.scheduler.set_active(True)
            log.info("manager %s leads (start)", self.manager_id)
            self._spawn(self._catch_up(now, resumed=None), "catch-up")
        else:
            self.scheduler.set_active(False)
            log.info("manager %s is standby", self.manager_id)
        self._changed()

    async def settled(self) -> None:
        """Wait while a takeover reads what the store records (for tests that drive a virtual
        clock: its reads take real time, its retries wait on the clock)."""
        await self._read.wait()

    async def _take_over(self, term: int) -> None:
        try:
            read = await self._settled_after(term)
            if read is None:
                return  # no longer leading: the next term decides
            # The look back (grace, and a fire_once schedule's catch-up window) is measured from
            # when the settled slots were read: a read retried for a while must not leave the
            # latest missed slot of a fire_once schedule to be skipped as late instead of caught up.
            now, settled, counted = read
            after = now - self.scheduler.grace
            await self.scheduler.rebase(after, settled, counted)
            if term != self._terms:
                return  # leadership changed during the rebase
            self.scheduler.set_active(True)
            log.info("manager %s leads (takeover)", self.manager_id)
        finally:
            self._read.set()
        await self._catch_up(now, resumed=after)

    async def take_over_some(
        self,
        register: Callable[[], Awaitable[Sequence[ScheduledEntry] | None]],
        keep: Callable[[int | str], bool],
        *,
        look_back: bool = True,
        since: datetime | None = None,
        registered: Callable[[], None] | None = None,
    ) -> bool:
        """A takeover of part of the schedules (partitions just taken): read what the store
        records as settled for the idents ``keep`` accepts, then ``register()`` their entries
        rebased as a takeover rebases them: each one new here is filed at its resumed slot as
        it is registered (:meth:`Scheduler.resuming`: one slot computed, none sent before the
        look back is set), any other is rebased next; then catch them up. Without
        ``look_back`` (schedules no manager held before) they start as at a first start. With
        ``since`` (when a manager first held them) the look back stops there: slots due until
        then are owed by nobody.
        ``register()`` returns the entries it registered, or None when it registered every
        row held (a full sync: every entry of a row is then one of them).
        ``registered()`` is called once they are registered and rebased. Their catch-up is
        spawned (not awaited). False when leading ended before the settled slots were read."""
        resumed: datetime | None = None  # a first start: the catch-up's up to now
        if not look_back:
            now = self.clock.now()
            some = _of_rows(self.scheduler, await register())
        else:
            read = await self._settled_after(self._terms, keep)
            if read is None:
                return False
            now, settled, _ = read
            after = now - self.scheduler.grace
            if since is not None and since > after:
                after = since  # held first since: nothing before it is owed
            resumed = after
            # The entries new here are filed rebased as they are registered (one slot each).
            with self.scheduler.resuming(after, settled, keep) as rebased:
                some = _of_rows(self.scheduler, await register())
            rest = [e for e in some if e.ident not in rebased] if len(rebased) < len(some) else []
            if rest:
                # options.max_runs: the runs left of what was just registered, from the store.
                counted = await read_counted(self.store.get_state, await limited(rest))
                await self.scheduler.rebase_some(rest, after, settled, counted)
        if registered is not None:
            registered()
        # The catch-up runs beside, as a leader's after its start: a paced one (misfire "all")
        # holds neither the sync lock nor a start waiting for its first takeover.
        caught = catchup.catch_up(
            self.scheduler,
            self.store,
            now,
            resumed=resumed,
            still_leading=lambda: self.leadership.is_leader,
            entries=some,
        )
        self._spawn(caught, "catch-up")
        return True

    def stalled(self, now: datetime) -> str | None:
        """Why this manager is unhealthy because a takeover cannot read the settled slots (for
        ``SETTLED_STALL_S`` or more: it sends nothing meanwhile); None otherwise."""
        if self._failing is None or self._failing[0] != self._terms:
            return None  # reading fine, or that term is over
        waited = (now - self._failing[1]).total_seconds()
        if waited < SETTLED_STALL_S:
            return None
        return f"takeover cannot read the settled slots for {waited:.0f} s ({self._failure})"

    async def _settled_after(
        self, term: int, keep: Callable[[int | str], bool] | None = None
    ) -> tuple[datetime, dict[int | str, datetime], dict[int | str, Counted]] | None:
        """When the read that succeeded started, and what the store records as settled after
        that instant minus grace, by ident, each capped at now (a value from the future only
        means nothing in the past may be sent). Retried while this term lasts; None once it
        ended."""
        try:
            return await self._read_settled(term, keep)
        finally:
            if self._failing is not None and self._failing[0] == term:
                self._failing = None  # read, or this term is over

    async def _read_settled(
        self, term: int, keep: Callable[[int | str], bool] | None
    ) -> tuple[datetime, dict[int | str, datetime], dict[int | str, Counted]] | None:
        failed = False
        while term == self._terms:
            read_at = self.clock.now()
            try:
                rows = await self.store.settled_after(read_at - self.scheduler.grace)
                entries = self.scheduler.entries()
                if keep is not None:
                    entries = [e for e in entries if keep(e.ident)]
                counted = await read_counted(self.store.get_state, await limited(entries))
            except Exception as exc:
                reraise_if_cancelled(exc)
                self._failure = cause(exc)
                if not failed:
                    self._failing = (term, self.clock.now())
                    log.error(
                        "takeover waits: cannot read the settled slots (%s); nothing is "
                        "sent until they are known",
                        self._failure,
                    )
                failed = True
                reading = self._read  # clear: this is the read of a (whole) takeover
                was_reading = not reading.is_set()
                reading.set()  # waiting on the clock, not reading
                try:
                    await self.clock.sleep(SETTLED_RETRY_S)
                finally:
                    if was_reading and reading is self._read and term == self._terms:
                        reading.clear()
                continue
            if term != self._terms:
                break  # leadership changed during the read
            if failed:
                log.info("takeover: settled slots read")
            now = self.clock.now()
            settled: dict[int | str, datetime] = {}
            shared: dict[datetime, datetime] = {}  # a burst settles many schedules at one slot
            async for part in in_turns(list(rows.items())):  # a million schedules
                for key, at in part:
                    ident = ident_of(key)
                    if keep is not None and not keep(ident):
                        continue
                    at = min(at, now)
                    settled[ident] = shared.setdefault(at, at)
            if term != self._terms:
                break  # leadership changed meanwhile
            return read_at, settled, counted
        return None

    async def _catch_up(self, now: datetime, *, resumed: datetime | None) -> None:
        """misfire=fire_once: send the latest missed slot within the catch-up window, once
        (``resumed``: see :func:`catchup.catch_up`)."""
        await catchup.catch_up(
            self.scheduler,
            self.store,
            now,
            resumed=resumed,
            still_leading=lambda: self.leadership.is_leader,
        )


def _of_rows(
    scheduler: Scheduler, registered: Sequence[ScheduledEntry] | None
) -> Sequence[ScheduledEntry]:
    """The entries ``register()`` registered: None, every entry of a row (not those registered
    from code, which every manager keeps outside the partitions)."""
    if registered is not None:
        return registered
    return [e for ident, e in scheduler.held().items() if type(ident) is int]
