"""Long passes share the event loop: the one way to let other tasks run during one.

A manager passes over a million entries now and then (a sync registering rows, publishing them, a
catch-up looking at them, a burst's run history). One pass in one go would hold the event loop for
a second: a slot due meanwhile would be sent late, and the leader's proof of leadership could time
out. :func:`in_turns` hands a pass its items slice by slice and lets the event loop run between
slices. Each slice is sized from the time the previous one took, so every turn holds the loop for
about :data:`TURN_S` however costly an item is (a lookup takes a microsecond, registering an entry
ten): no pass has a tuned constant of its own.

A pass that sends to the workers (a ``misfire: "all"`` catch-up, a backfill) goes at a rate
instead: :func:`paced` hands it batches at most ``PM_CATCHUP_RATE`` items a second on the
clock's time, so a long outage or a wide range does not flood the workers.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

T = TypeVar("T")

TURN_S = 0.004  # how long a pass holds the event loop between two turns of the others
FIRST = 256  # items in the first slice, before anything is measured
LARGEST = 100_000  # items in one slice at most (a slice is a copy of that many references)


async def in_turns(items: Sequence[T]) -> AsyncIterator[Sequence[T]]:
    """``items`` in consecutive slices; between two slices the event loop runs the other tasks.

    The time measured for a slice is the caller's work on it (the generator is suspended while
    the caller works), read with ``time.perf_counter``: a duration, not an instant of any
    schedule.
    """
    size, start, n = FIRST, 0, len(items)
    while start < n:
        part = items[start : start + size]
        began = time.perf_counter()
        yield part
        took = time.perf_counter() - began
        start += len(part)
        if start >= n:
            return
        await asyncio.sleep(0)
        # Aim at TURN_S for the next slice; at most double at a time (one cheap slice of a costly
        # pass must not make the next one huge).
        if took > 0:
            size = max(1, min(LARGEST, 2 * size, int(size * TURN_S / took)))
        else:
            size = min(LARGEST, 2 * size)


# -- paced sends ---------------------------------------------------------------------------------

# A paced pass sends at most ten steps a second: PM_CATCHUP_RATE slots a second as ten small
# batches rather than one burst at the top of each second.
STEPS_PER_S = 10


class _Sleeper(Protocol):
    def now(self) -> datetime: ...

    async def sleep_until(self, instant: datetime) -> None: ...


async def paced(clock: _Sleeper, rate: float, items: Iterable[T]) -> AsyncIterator[list[T]]:
    """``items`` in batches, at most ``rate`` items a second on ``clock``'s time: batch ``k``
    (of ``ceil(rate / 10)`` items) is handed over at ``start + k * batch / rate`` seconds
    (``start``: the first batch, at once). ``items`` is read lazily, each batch at its instant
    (a filter in ``items`` judges an item when it is sent, not a batch earlier), so the end of
    ``items`` is found one step after the last batch."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0 (got {rate!r})")
    step = max(1, math.ceil(rate / STEPS_PER_S))
    interval = step / rate
    start = clock.now()
    source = iter(items)
    k = 0
    while True:
        if k:
            await clock.sleep_until(start + timedelta(seconds=k * interval))
        batch = list(itertools.islice(source, step))
        if not batch:
            return
        yield batch
        k += 1
