"""Clocks: the only place that reads the time.

Everything else takes ``now`` from an injected :class:`~periodic_manager.contracts.Clock`.
:class:`SystemClock` is the real one; :class:`VirtualClock` is a deterministic clock for tests and
demos whose ``sleep`` waits for virtual time, which a driver moves forward with
:meth:`VirtualClock.advance_to`. :func:`sleep_unless` is the one way to wait on a clock for a
while, or until something happens first; :func:`next_tick` is when a periodic loop wakes next
(periodic loops of one period wake together).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from periodic_manager.contracts import Clock


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_LATEST = datetime.max.replace(tzinfo=UTC)


def later(instant: datetime, seconds: float | timedelta) -> datetime:
    """``instant`` + ``seconds``, saturating at the last representable instant."""
    step = seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds)
    return instant + step if _LATEST - instant > step else _LATEST


def next_tick(now: datetime, every: float) -> datetime:
    """The first instant after ``now`` that is a whole number of ``every`` seconds (to the
    microsecond) since the Unix epoch. Loops that wait for ticks of one period (or of periods
    that are multiples of each other) wake at the same instants: on :class:`SystemClock`, in
    one wakeup of the process, which is most of what a manager at rest costs."""
    step = max(1, round(every * 1_000_000))
    return EPOCH + _US * ((now - EPOCH) // _US // step + 1) * step


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class SystemClock:
    """The wall clock. ``sleep`` is ``asyncio.sleep``."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, instant: datetime) -> None:
        loop = asyncio.get_running_loop()
        when = _deadline(loop, instant)
        if when is None:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = loop.create_future()
        timer = loop.call_at(when, _wake, fut)
        try:
            await fut
        finally:
            timer.cancel()

    async def wait_until(self, event: asyncio.Event, instant: datetime) -> bool:
        """Wait for ``event`` until ``instant`` at most; True when it was set. No task of its
        own (:func:`sleep_unless` waits so for one event: the loops of a manager at rest)."""
        when = _deadline(asyncio.get_running_loop(), instant)
        if when is None:
            await asyncio.sleep(0)
            return event.is_set()
        try:
            async with asyncio.timeout_at(when):
                await event.wait()
        except TimeoutError:
            return event.is_set()
        return True


def _deadline(loop: asyncio.AbstractEventLoop, instant: datetime) -> float | None:
    """``instant`` in the loop's time (None: it has come). now() is read here, in the step that
    arms the timer; the deadline is rounded up to the millisecond, so sleepers until one instant
    share one deadline and wake in one pass of the loop (asyncio.sleep would arm each a few
    microseconds apart, then wake the process once for each)."""
    left = (instant - datetime.now(UTC)).total_seconds()
    if left <= 0:
        return None
    return math.ceil((loop.time() + left) * 1000) / 1000


def _as_utc(instant: datetime) -> datetime:
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError("a naive datetime is not an instant; give it a tzinfo")
    return instant.astimezone(UTC)


class VirtualClock:
    """A clock that moves only when told to.

    ``sleep(d)`` parks the caller until virtual time reaches ``now + d``. A test drives time with
    :meth:`advance` / :meth:`advance_to`, which wake sleepers in deadline order and let the event
    loop settle after each step; :meth:`set` steps the clock without waking anybody (to simulate a
    wall clock jumping back or forward). :meth:`monotonic` moves with :meth:`advance` and
    :meth:`advance_to` (by the time they move forward) and never with :meth:`set`, as a real
    monotonic clock ignores a step of the wall clock.
    """

    def __init__(self, start: datetime, *, settle_rounds: int = 20) -> None:
        self._now = _as_utc(start)
        self._mono = 1000.0  # seconds; only differences mean anything
        self._waiters: list[tuple[datetime, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._settle_rounds = settle_rounds

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        await self._woken_at(self._now + timedelta(seconds=seconds))

    async def sleep_until(self, instant: datetime) -> None:
        instant = _as_utc(instant)
        if instant <= self._now:
            await asyncio.sleep(0)
            return
        await self._woken_at(instant)

    async def _woken_at(self, instant: datetime) -> None:
        """Wait among the sleepers until virtual time is moved to ``instant`` or past it."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (instant, next(self._seq), fut))
        try:
            await fut
        finally:
            if not fut.done():
                fut.cancel()

    async def wait_until(self, event: asyncio.Event, instant: datetime) -> bool:
        """Wait for ``event`` until virtual time reaches ``instant`` at most; True when it was set."""
        waiter = asyncio.ensure_future(event.wait())
        sleeper = asyncio.ensure_future(self.sleep_until(instant))
        try:
            await asyncio.wait((waiter, sleeper), return_when=asyncio.FIRST_COMPLETED)
            return event.is_set()
        finally:
            for task in (waiter, sleeper):
                task.cancel()
            await asyncio.gather(waiter, sleeper, return_exceptions=True)

    def set(self, instant: datetime) -> None:
        """Step the clock to ``instant`` (earlier or later) without waking sleepers."""
        self._now = _as_utc(instant)

    def elapse(self, seconds: float) -> None:
        """Let ``seconds`` pass (wall and monotonic clocks alike) without waking sleepers: a
        process whose event loop was held past its deadlines (a CPU-bound pass, a freeze)."""
        self._move_to(later(self._now, seconds))

    def next_deadline(self) -> datetime | None:
        """The earliest deadline of a live sleeper, if any."""
        self._drop_cancelled()
        return self._waiters[0][0] if self._waiters else None

    async def settle(self) -> None:
        """Let ready tasks run (a fixed number of loop iterations; no wall-clock wait)."""
        for _ in range(self._settle_rounds):
            await asyncio.sleep(0)

    async def advance(
        self, seconds: float, settle: Callable[[], Awaitable[object]] | None = None
    ) -> None:
        await self.advance_to(self._now + timedelta(seconds=seconds), settle)

    async def advance_to(
        self, target: datetime, settle: Callable[[], Awaitable[object]] | None = None
    ) -> None:
        """Move time forward to ``target``, waking sleepers in deadline order.

        After each step the loop settles, then ``settle()`` is awaited when given (for example a
        scheduler's ``wait_processed``), so work that involves real I/O completes before time moves on.
        """
        target = _as_utc(target)
        while True:
            self._wake_due()
            await self._step_done(settle)
            deadline = self.next_deadline()
            if deadline is None or deadline > target or deadline <= self._now:
                break
            self._move_to(deadline)
        self._move_to(max(self._now, target))
        self._wake_due()
        await self._step_done(settle)

    def _move_to(self, instant: datetime) -> None:
        """Time passes up to ``instant``: the monotonic clock moves as much forward."""
        self._mono += max(0.0, (instant - self._now).total_seconds())
        self._now = instant

    def _wake_due(self) -> None:
        while self._waiters and self._waiters[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._waiters)
            if not fut.done():
                fut.set_result(None)

    async def _step_done(self, settle: Callable[[], Awaitable[object]] | None) -> None:
        await self.settle()
        if settle is not None:
            await settle()
            await self.settle()

    def _drop_cancelled(self) -> None:
        while self._waiters and self._waiters[0][2].done():
            heapq.heappop(self._waiters)


async def sleep_unless(
    clock: Clock,
    *events: asyncio.Event,
    seconds: float | None = None,
    until: datetime | None = None,
) -> bool:
    """Sleep on ``clock`` for ``seconds`` (or until ``until``; neither: until an event), cut short
    as soon as one of ``events`` is set. True when an event ended the wait.

    The sleep runs on the clock (a virtual clock drives it in tests) and, with ``until``, measures
    the time left when its timer is armed, so work queued before it first runs cannot make it
    late. Whatever ends the wait, nothing of it is left running.
    """
    if len(events) == 1 and (until is not None or seconds is not None):
        # The common case (a periodic loop and its wake-up event): the clock's own wait.
        instant = until if until is not None else later(clock.now(), seconds or 0.0)
        return await clock.wait_until(events[0], instant)
    waiters: list[asyncio.Future[object]] = [asyncio.ensure_future(e.wait()) for e in events]
    if until is not None:
        waiters.append(asyncio.ensure_future(clock.sleep_until(until)))
    elif seconds is not None:
        waiters.append(asyncio.ensure_future(clock.sleep(seconds)))
    try:
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        return any(w in done for w in waiters[: len(events)])
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
