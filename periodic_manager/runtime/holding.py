"""What a change of the partitions held does to a manager (``PM_COORDINATION=partitions``).

The manager holds entries only for the partitions it leases
(:mod:`periodic_manager.runtime.partitions`); its provider reads only their rows.

* **Taken** (at start, on a join's hand-over, after a dead manager's lease expired): a takeover
  of those partitions alone (a partition no manager ever held starts as a first start does, with
  no look back), as :class:`~periodic_manager.runtime.leading.Leading` does for a
  whole scheduler: what the store records as settled for their schedules is read, their rows
  are read and registered, and each entry resumes at its first slot after ``now - grace``, after
  the instant a manager first held its partition (slots due before are owed by nobody: a share
  handed over a round after a cluster's first start looks back over nothing older) and after
  its settled slot (a ``fire_once`` or ``all`` one is caught up beside, as after a leader's
  start). Partitions first held at different instants within grace are taken over apart. A
  manager holding nothing that takes every partition (alone) registers its rows by a full sync,
  the path of a leader's first sync. Runs beside the lease rounds (a renewal never waits for
  it), under the sync lock (a sync never sees half of it); retried while the partitions are
  held.
* **Lost** (taken by another manager, or its trust ran out): sending for its entries stops at
  once (the scheduler's fence: nothing of those partitions is sent, a staged batch included),
  then they are unregistered in turns with the other tasks (a million entries must not hold the
  event loop); the fence is lifted when they are gone, their timetable filings and the room
  they took in the map of entries go too (:meth:`Scheduler.compact
  <periodic_manager.engine.scheduler.Scheduler.compact>`), and the memory they freed is given
  back to the system (:func:`periodic_manager.gcpolicy.release`; what the allocator can give
  back: bench/handover_memory.txt). A takeover waits for the drops under way
  (a partition lost and taken back is read afresh).
* **Handed over** (a join, a SIGTERM): the same, then a send under way finishes and the runs
  reported so far are written to the store before the leases are released, so the next holder
  reads them as settled.

Schedules registered from code have no partition: every manager keeps them (the targets'
claims keep one of each slot).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from periodic_manager import gcpolicy
from periodic_manager.contracts import PartitionedProvider, PartitionLeadership, PartitionsHeld
from periodic_manager.engine.entry import ScheduledEntry
from periodic_manager.errors import ProviderError, cause
from periodic_manager.runtime.leading import SETTLED_RETRY_S, Leading, Spawn
from periodic_manager.runtime.sync import Syncer, settle_after
from periodic_manager.runtime.tasks import reraise_if_cancelled
from periodic_manager.schedules.partition import every_partition, partition_of

log = logging.getLogger(__name__)


class PartitionHolding:
    """The :class:`~periodic_manager.contracts.PartitionHandler` of a manager (see the module
    doc); :meth:`holds` is the reconciler's ``keep``."""

    def __init__(
        self,
        leases: PartitionLeadership,
        provider: PartitionedProvider,
        syncer: Syncer,
        leading: Leading,
        *,
        spawn: Spawn,
        changed: Callable[[], None],
    ) -> None:
        self.leases = leases
        self.provider = provider
        self.syncer = syncer
        self.reconciler = syncer.reconciler
        self.scheduler = syncer.scheduler
        self.leading = leading
        self._spawn = spawn
        self._changed = changed  # after every change of the entries held (the heartbeat tells)
        self.mine: set[int] = set()  # the partitions whose entries this manager keeps
        self.taking: set[asyncio.Task[object]] = set()  # takeovers under way
        self.drops: dict[asyncio.Task[object], frozenset[int]] = {}  # drops under way (fenced)
        # Before the first round (count unknown) nothing is held: no row is read.
        provider.restrict(lambda: PartitionsHeld(max(1, self.leases.count), frozenset(self.mine)))
        self.reconciler.keep = self.holds
        # Before every send: a partition whose trust has ended is dropped and fenced off then.
        self.scheduler.before_send = leases.expire
        self.reconciler.keeper.scope = self.holds

    def holds(self, ident: int | str) -> bool:
        """Whether this manager keeps the schedule ``ident`` (code-registered ones: always)."""
        if not isinstance(ident, int):
            return True
        mine = self.mine
        if not mine:
            return False  # none held (before the first round, the count is not even known)
        count = self.leases.count
        if every_partition(mine, count):
            return True  # a manager alone: asked once per row registered
        return partition_of(ident, count) in mine

    async def taken(self, bound_s: float) -> None:
        """Return once the takeovers under way have ended, or after ``bound_s`` on the clock
        (a takeover that keeps failing retries on; the start does not wait for it)."""
        timer = asyncio.ensure_future(self.scheduler.clock.sleep(bound_s))
        try:
            while self.taking and not timer.done():
                await asyncio.wait({*self.taking, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()

    async def quiet(self) -> None:
        """Return once no takeover nor drop of partitions is under way (tests)."""
        while self.taking or self.drops:
            await asyncio.gather(*self.taking, *self.drops, return_exceptions=True)

    # -- the PartitionHandler ------------------------------------------------------------------

    async def gained(
        self, partitions: frozenset[int], fresh: frozenset[int], first_held: Mapping[int, datetime]
    ) -> None:
        self.mine |= partitions
        # One takeover per bound of the look back: those first held longer than grace ago (or
        # before it was recorded) look back the full grace, together; the look back is judged
        # later than now, so a bound older than grace now never matters.
        oldest = self.scheduler.clock.now() - self.scheduler.grace
        bounds: dict[datetime | None, set[int]] = {}
        for p in partitions - fresh:
            since = first_held.get(p)
            bounds.setdefault(since if since is not None and since > oldest else None, set()).add(p)
        for since, part in bounds.items():
            self._start_takeover(frozenset(part), look_back=True, since=since)
        if fresh:
            self._start_takeover(fresh, look_back=False, since=None)

    async def releasing(self, partitions: frozenset[int]) -> None:
        await self._drop(partitions)
        if not await self.scheduler.flush_runs():
            log.error(
                "handing over %d partition(s) with run records unwritten (the store fails): "
                "the next holder relies on the targets' claims for them",
                len(partitions),
            )

    def lost(self, partitions: frozenset[int]) -> None:
        self._drop(partitions)

    # -- the work ------------------------------------------------------------------------------

    def _start_takeover(
        self, partitions: frozenset[int], *, look_back: bool, since: datetime | None
    ) -> None:
        takeover = _Takeover(self, partitions, look_back=look_back, since=since)
        task = self._spawn(takeover.run(), "partition-takeover")
        self.taking.add(task)
        task.add_done_callback(self.taking.discard)

    def _drop(self, partitions: frozenset[int]) -> asyncio.Task[object]:
        """Stop sending for ``partitions`` now (the fence), and unregister their entries in
        turns (the task returned)."""
        self.mine -= partitions
        task = self._spawn(self._dropping(partitions), "partition-drop")
        self.drops[task] = partitions
        self._fence()
        task.add_done_callback(self._dropped)
        return task

    def _fence(self) -> None:
        fenced = frozenset().union(*self.drops.values())
        count = self.leases.count
        self.scheduler.fence(
            (lambda ident: isinstance(ident, int) and partition_of(ident, count) in fenced)
            if fenced
            else None
        )

    def _dropped(self, task: asyncio.Task[object]) -> None:
        self.drops.pop(task, None)
        self._fence()

    def _synced(self) -> bool:
        """Whether any entry of a row is held (a partition's, still being dropped included)."""
        return any(type(ident) is int for ident in self.scheduler.held())

    async def _dropping(self, partitions: frozenset[int]) -> None:
        count = self.leases.count
        removed = await self.reconciler.drop(
            lambda ident: isinstance(ident, int) and partition_of(ident, count) in partitions
        )
        log.info("partitions %s: %d entries dropped", sorted(partitions)[:8], removed)
        if removed:
            # Their timetable filings and the map's room went with them (else the entries
            # stayed in memory until their next slot), then the memory is given back.
            await self.scheduler.compact()
            gcpolicy.release()  # a share handed over gives its memory back (see gcpolicy)
        self._changed()


class _Takeover:
    """One takeover of ``partitions`` (module doc, **Taken**), read top to bottom in
    :meth:`run`: wait for the drops under way, then, under the sync lock and until done or the
    partitions are gone, read the settled slots and register the rows (:meth:`register`), then
    say so; a failure is retried after ``SETTLED_RETRY_S``."""

    def __init__(
        self,
        holding: PartitionHolding,
        partitions: frozenset[int],
        *,
        look_back: bool,
        since: datetime | None,
    ) -> None:
        self.holding = holding
        self.partitions = partitions
        self.look_back = look_back
        self.since = since
        self.count = holding.leases.count
        self.registered = 0  # entries registered by a read of the partitions' rows
        self.synced = 0  # ... or by a full sync (added, replaced or unchanged)

    async def run(self) -> None:
        holding = self.holding
        while holding.drops:  # a partition lost and taken back: its old entries go first
            await asyncio.gather(*holding.drops, return_exceptions=True)
        while self.partitions & holding.mine:
            try:
                if await self._attempt():
                    self._done()
                    return
                # Leading ended during the read: the partitions still held are taken again.
            except Exception as exc:
                reraise_if_cancelled(exc)
                log.error(
                    "taking over %d partition(s) failed, retrying: %s",
                    len(self.partitions),
                    cause(exc),
                )
            await holding.scheduler.clock.sleep(SETTLED_RETRY_S)

    async def _attempt(self) -> bool:
        """Read the settled slots and register the rows, as a sync does (under its lock, a
        million rows read and registered with the collector paused); False when leading ended
        during the read."""
        holding = self.holding
        async with holding.syncer.lock:
            with gcpolicy.paused():
                return await holding.leading.take_over_some(
                    self.register,
                    self.taken,
                    look_back=self.look_back,
                    since=self.since,
                    registered=self.settle,
                )

    def taken(self, ident: int | str) -> bool:
        """Whether ``ident`` is a row of these partitions still held (asked once per row
        registered: no set built)."""
        if not isinstance(ident, int):
            return False
        part = partition_of(ident, self.count)
        return part in self.partitions and part in self.holding.mine

    async def register(self) -> Sequence[ScheduledEntry] | None:
        """Read and register the rows of the partitions still held: the entries registered,
        or None when a full sync registered every row held."""
        holding = self.holding
        still = frozenset(self.partitions & holding.mine)
        if not still:
            return []
        if still == holding.mine and every_partition(still, self.count) and not holding._synced():
            # Every partition taken by a manager that held none (a manager alone, at its
            # start or after the others stopped): its rows are read and registered by a
            # full sync, the path of a leader's first sync (one streamed read, one pass).
            report = await holding.syncer.sync_held(full=True)
            if not report.ok:
                raise ProviderError(report.error or "the sync failed")
            self.synced = report.added + report.replaced + report.unchanged
            return None  # every entry
        snapshot = await holding.provider.get_partitions(still)
        entries = await holding.reconciler.apply_some(snapshot, holding.scheduler.clock.now())
        self.registered = len(entries)
        return entries

    def settle(self) -> None:
        # Registered and rebased, the collector still paused: the survivors are frozen
        # before it runs again (re-enabled first, its next pass walked a million young
        # objects: ~1 s of a lone manager's 1M start, before "started").
        settle_after(self.registered)

    def _done(self) -> None:
        """The instant a takeover's entries are registered (a fresh partition's first slot
        comes after it), the counterpart of "entries dropped"."""
        how = "never held before"
        if self.look_back:
            how = "looking back" if self.since is None else f"first held at {self.since:%H:%M:%S}"
        log.info(
            "partitions %s: %d entries registered (%s)",
            sorted(self.partitions)[:8],
            self.registered or self.synced,
            how,
        )
        self.holding._changed()
