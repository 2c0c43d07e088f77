"""Retrying what a target failed in a way a retry may mend, beside the scheduler's loop.

The loop awaits a sub-batch's first attempt only (:mod:`~periodic_manager.engine.dispatch`).
The tasks of a call that raised, and the tasks a target failed one by one without refusing them
for good (``EnqueueResult.permanent`` False: a connection lost, a claim another publisher holds),
are handed to a retry task of their own, per slot, which sends them again with capped
exponential backoff. So a schedule whose target keeps failing never holds the next instant of
another schedule: those go out on time while the retry waits.

A retry ends when every task is settled (its outcomes recorded as they come), and gives up,
recording what is left ``failed`` with the last error, when:

- the next attempt would fall after the slots' expiry (grace, or the catch-up window);
- the scheduler stops or no longer sends (leadership lost): quietly, a warning;
- the target refuses the tasks for good (``TaskRefused``, or results marked ``permanent``).

While the target is down (its last call raised), the retries do not each call it: one of them
probes it at a time, the probes spaced like one retry's backoff (0.2 s doubling to ``retry_max``),
and the others wait for the target to answer (or for their slots to leave grace). So an outage
costs one call per due instant (the first attempts, which the loop makes at each instant whatever
the target did last) and one probe per backoff, however many slots wait.

Tasks whose partition is fenced off (lost, handed over) are given up right before the next
attempt, as the first attempt would: the fence is asked before every call. At most ``limit``
retry calls run at once, apart from the first attempts (a retry never queues a new instant's
send behind it). A (schedule, slot) under retry is in :attr:`Retries.pending`: a held slot
(``options.overlap`` hold) is not sent again by its hold tick meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from periodic_manager.clock import later
from periodic_manager.contracts import Clock, EnqueueResult, Task, retryable
from periodic_manager.errors import TargetError, TaskRefused

if TYPE_CHECKING:
    from periodic_manager.engine.entry import ScheduledEntry

log = logging.getLogger(__name__)

STOP_WAIT_S = 10.0  # how long a stopping scheduler waits for the retries to record their runs
_X = TypeVar("_X")


# Record entries failed for good: (slot, entries, their tasks, the error, quiet).
GiveUp = Callable[
    [datetime, list["ScheduledEntry"], list[Task], BaseException, bool], Awaitable[None]
]


class Sender(Protocol):
    """What the retries need of the dispatcher that owns them (``engine.dispatch.Dispatcher``):
    its target, clock and pauses, the fence, and how it records outcomes."""

    target: Any  # the target tasks are enqueued to (its ``enqueue``)
    clock: Clock
    retry_base: float
    retry_max: float
    failing: int
    backoff: Callable[[float], Awaitable[None]]
    may_send: Callable[[], bool]
    fence: Callable[[], Callable[[int | str], bool] | None]

    def begin(self) -> None: ...
    def end(self) -> None: ...
    def recovered(self, retrying: int = 0) -> None: ...
    async def attempt(self, send: Awaitable[list[EnqueueResult]]) -> list[EnqueueResult]: ...
    async def settle(
        self, slot: datetime, entries: list[ScheduledEntry], results: list[EnqueueResult]
    ) -> None: ...
    @property
    def give_up(self) -> GiveUp: ...


def _pick(at: Sequence[int], items: list[_X]) -> list[_X]:
    return [items[i] for i in at]


class _Left(NamedTuple):
    """What a retry still has to send: entries, their tasks, and the last attempt's per-task
    failures (None: the last call raised, or none was made)."""

    entries: list[ScheduledEntry]
    tasks: list[Task]
    failed: list[EnqueueResult] | None

    def pick(self, at: Sequence[int]) -> _Left:
        failed = None if self.failed is None else _pick(at, self.failed)
        return _Left(_pick(at, self.entries), _pick(at, self.tasks), failed)


class Retries:
    """The background retries of one dispatcher."""

    def __init__(self, dispatcher: Sender, *, limit: int) -> None:
        self.dispatcher = dispatcher
        self.tasks: set[asyncio.Task[None]] = set()
        self.active = 0  # retries not ended (a task's end is seen by its callback a step later)
        self.pending: set[tuple[int | str, datetime]] = set()  # (ident, slot) under retry
        self._gate = asyncio.Semaphore(limit)
        self._down_until: datetime | None = None  # the target is down: no retry calls it before
        self._probe_delay = dispatcher.retry_base  # the pause after the next failed probe

    def note(self, answered: bool) -> None:
        """A call of the target answered (True) or raised (False; a refusal for good aside)."""
        d = self.dispatcher
        if answered:
            self._down_until = None
            self._probe_delay = d.retry_base
        else:
            self._down_until = later(d.clock.now(), self._probe_delay)
            self._probe_delay = min(d.retry_max, self._probe_delay * 2)

    async def _turn(self, deadline: datetime) -> bool:
        """Wait while the target is down and another retry's probe is due first. True when this
        retry may call now (while down, as the probe: the next one waits for its outcome);
        False when it is to give up (its slots' expiry comes before the next probe, or the
        scheduler no longer sends)."""
        d = self.dispatcher
        while self._down_until is not None and d.clock.now() < self._down_until:
            if self._down_until > deadline:
                return False
            await d.backoff((self._down_until - d.clock.now()).total_seconds())
            if not d.may_send():
                return False
        if self._down_until is not None:
            self._down_until = later(d.clock.now(), self._probe_delay)
        return True

    def take(
        self,
        slot: datetime,
        entries: list[ScheduledEntry],
        tasks: list[Task],
        error: BaseException | str | None,
    ) -> bool:
        """Retry ``tasks`` (of ``entries``, due ``slot``) in the background, after the first
        attempt failed with ``error``. False when they are not to be retried (the caller
        records them failed now): a refusal for good, not sending, or no time left."""
        d = self.dispatcher
        if isinstance(error, TaskRefused) or not tasks or not d.may_send():
            return False
        deadline = min(t.expires_at for t in tasks)
        if later(d.clock.now(), d.retry_base) > deadline:
            return False
        if not d.failing:
            log.error(
                "enqueue failed, retrying while slots are within grace: %s",
                error,
                extra={"slot": slot.isoformat(), "batch": len(tasks)},
            )
        d.failing += 1
        text = str(error)
        for entry in entries:
            entry.last_error = text  # shown while the retry goes on
            self.pending.add((entry.ident, slot))
        task = asyncio.get_running_loop().create_task(
            self._retry(slot, entries, tasks, error), name=f"retry {slot.isoformat()}"
        )
        self.tasks.add(task)
        self.active += 1
        task.add_done_callback(self._done)
        return True

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a retry failed", exc_info=task.exception())

    async def _retry(
        self,
        slot: datetime,
        entries: list[ScheduledEntry],
        tasks: list[Task],
        error: BaseException | str | None,
    ) -> None:
        d = self.dispatcher
        keys = [(e.ident, slot) for e in entries]
        deadline = min(t.expires_at for t in tasks)
        left = _Left(entries, tasks, None)
        d.begin()
        try:
            attempt = 1
            while True:
                delay = min(d.retry_max, d.retry_base * 2 ** (attempt - 1))
                if not d.may_send() or later(d.clock.now(), delay) > deadline:
                    break
                await d.backoff(delay)
                if not d.may_send() or not await self._turn(deadline):
                    break
                left = await self._unfenced(slot, left, error)
                if not left.entries:
                    return
                try:
                    async with self._gate:
                        results = await d.attempt(d.target.enqueue(left.tasks, d.clock.now()))
                except Exception as exc:  # noqa: BLE001 - reported when given up
                    error, left = exc, left._replace(failed=None)
                    d.failing += 1
                    if isinstance(exc, TaskRefused):
                        break
                    attempt += 1
                    continue
                left = await self._settle(slot, left, results)
                if not left.entries:
                    d.recovered(retrying=1)  # this one
                    return
                error = left.failed[0].error if left.failed else error
                d.failing += 1
                attempt += 1
            await self._give_up(slot, left, error)
        finally:
            self.active -= 1
            self.pending.difference_update(keys)
            d.end()

    async def _settle(self, slot: datetime, left: _Left, results: list[EnqueueResult]) -> _Left:
        """Record what an attempt settled; what is still to retry (with its failures)."""
        again = [i for i, res in enumerate(results) if retryable(res)]
        keep = set(again)
        done = [i for i in range(len(results)) if i not in keep]
        await self.dispatcher.settle(slot, _pick(done, left.entries), _pick(done, results))
        return _Left(_pick(again, left.entries), _pick(again, left.tasks), _pick(again, results))

    async def _unfenced(
        self, slot: datetime, left: _Left, error: BaseException | str | None
    ) -> _Left:
        """``left`` less the entries the fence now stops (given up, as a first attempt would)."""
        fenced = self.dispatcher.fence()
        if fenced is None or not any(fenced(e.ident) for e in left.entries):
            return left
        out = [i for i, e in enumerate(left.entries) if fenced(e.ident)]
        gone = set(out)
        await self._give_up(slot, left.pick(out), error, quiet=True)
        return left.pick([i for i in range(len(left.entries)) if i not in gone])

    async def _give_up(
        self, slot: datetime, left: _Left, error: BaseException | str | None, *, quiet: bool = False
    ) -> None:
        d = self.dispatcher
        quiet = quiet or not d.may_send()
        if left.failed is not None and not quiet:
            await d.settle(slot, left.entries, left.failed)  # each task's own error
            return
        exc = error if isinstance(error, BaseException) else TargetError(str(error))
        await d.give_up(slot, left.entries, left.tasks, exc, quiet)

    async def close(self) -> None:
        """Wait (at most ``STOP_WAIT_S`` seconds) for the retries to end and record their runs: the
        scheduler is stopping, so each gives up at its next step. Those still running then are
        cancelled (a target call that does not return)."""
        if not self.tasks:
            return
        _, late = await asyncio.wait(set(self.tasks), timeout=STOP_WAIT_S)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)
