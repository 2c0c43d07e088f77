"""``options.pause_after_failures``: the loop that counts a schedule's failed tasks and pauses it.

Every ``interval`` seconds, while this manager sends (it leads, or holds partitions), for the
entries it holds whose options ask for it (found again only after the entries changed: at rest a
round walks none of them; at most :data:`SCHEDULES_PER_ROUND` a round, in turns so that every
one comes round): read the stored count and the runs sent since the last one
counted (the run history's message ids, at most :data:`RUNS_PER_SCHEDULE`), ask the target for
their outcomes (:class:`~periodic_manager.contracts.FailureSignal`), walk them
(:func:`periodic_manager.schedules.failures.count`) and store where the walk ended. Once the count
reaches the option's value, the schedule is paused through the one schedule writer (a
:class:`~periodic_manager.contracts.Pauser`: source ``manager``, with a note saying why), the
count starts again from 0, and a sync is asked for so that the entry goes at once.

The count lives in the database, so a restart, a takeover or a partition move goes on where the
last manager left off. A failure to read or write (the database or the broker down) is logged and
retried next round; nothing a row or a broker holds can stop the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from periodic_manager.clock import next_tick
from periodic_manager.contracts import Clock, FailureSignal, FailureStore, Pauser
from periodic_manager.engine.entry import ScheduledEntry
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.errors import TargetError, cause
from periodic_manager.pacing import in_turns
from periodic_manager.runtime.tasks import reraise_if_cancelled
from periodic_manager.schedules import failures

log = logging.getLogger(__name__)

SCHEDULES_PER_ROUND = 200  # schedules checked per round (the others in the next rounds)
RUNS_PER_SCHEDULE = 100  # runs read per schedule and round (the rest in the next rounds)


class FailureWatch:
    """Counts failed tasks of the entries of ``scheduler`` and pauses their schedules."""

    def __init__(
        self,
        scheduler: Scheduler,
        store: FailureStore,
        target: FailureSignal,
        pauser: Pauser,
        *,
        clock: Clock,
        manager_id: str,
        interval: float,
        paused: Callable[[], None],
    ) -> None:
        self.scheduler = scheduler
        self.store = store
        self.target = target
        self.pauser = pauser
        self.clock = clock
        self.manager_id = manager_id
        self.interval = interval
        self.paused = paused  # asks for a sync (the paused entry goes)
        self._next = 0  # where the next round starts among the schedules with the option
        self._watched: list[ScheduledEntry] = []  # the entries with the option...
        self._watched_at = -1  # ... as of this count of the scheduler's entry changes

    async def run(self) -> None:
        while True:
            await self.clock.sleep_until(next_tick(self.clock.now(), self.interval))
            if self.scheduler.active:
                await self.round()

    async def round(self) -> int:
        """Check one round of schedules; the number paused."""
        watched = await self._watched_entries()
        if not watched:
            return 0
        start = self._next % len(watched)
        chosen = (watched[start:] + watched[:start])[:SCHEDULES_PER_ROUND]
        self._next = start + len(chosen)
        paused = 0
        for entry in chosen:
            try:
                paused += await self.check(entry)
            except TargetError as exc:  # the broker is down: the rest waits for the next round
                log.warning(
                    "pause_after_failures: cannot read task outcomes (will retry): %s", cause(exc)
                )
                break
            except Exception as exc:
                reraise_if_cancelled(exc)
                log.warning(
                    "pause_after_failures: cannot check %s (will retry): %s", entry.name, exc
                )
        if paused:
            self.paused()
        return paused

    async def _watched_entries(self) -> list[ScheduledEntry]:
        """The entries whose options ask for a count, walked again only when an entry was
        registered or removed since the last walk (an entry's options never change)."""
        changes = self.scheduler.registered.changes  # read first: a change during the walk counts
        if changes != self._watched_at:
            watched: list[ScheduledEntry] = []
            async for part in in_turns(self.scheduler.entries()):
                watched += [e for e in part if failures.limit_of(e.options) is not None]
            self._watched, self._watched_at = watched, changes
        return self._watched

    async def check(self, entry: ScheduledEntry) -> bool:
        """Count the new outcomes of one schedule; True when it was paused."""
        limit = failures.limit_of(entry.options)
        if limit is None:
            return False
        stored = await self.store.failure_count(entry.key, RUNS_PER_SCHEDULE)
        ids = [task_id for _, task_id in stored.runs if task_id is not None]
        states = await self.target.outcomes(entry.options, ids) if ids else []
        if len(states) != len(ids):
            raise ValueError(f"the target answered {len(states)} outcomes for {len(ids)} tasks")
        counted = failures.count(
            stored.failures, stored.runs, dict(zip(ids, states, strict=True)), self.clock.now()
        )
        if counted.checked_at is not None:
            await self.store.save_failure_count(entry.key, counted.failures, counted.checked_at)
        if counted.failures < limit:
            return False
        note = failures.note(counted.failures, counted.last_failed)
        done = await self.pauser.pause(entry.key, note, self.manager_id)
        await self.store.reset_failure_count(entry.key)
        if done:
            log.warning("schedule %s %s", entry.name, note)
        return done
