"""pacing.paced: batches of ceil(rate / 10) items, batch k handed over at start + k * batch /
rate on the clock's time; items read lazily, each batch at its instant (virtual clock)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from periodic_manager.clock import VirtualClock
from periodic_manager.pacing import paced

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


async def handed(rate: float, n: int) -> list[tuple[timedelta, list[int]]]:
    clock = VirtualClock(T0)
    out: list[tuple[timedelta, list[int]]] = []

    async def consume() -> None:
        async for batch in paced(clock, rate, range(n)):
            out.append((clock.now() - T0, batch))

    task = asyncio.ensure_future(consume())
    while not task.done():
        await clock.advance(0.05)
    await task
    return out


@pytest.mark.parametrize(
    ("rate", "size", "every_s"), [(50, 5, 0.1), (1, 1, 1.0), (15, 2, 2 / 15), (0.5, 1, 2.0)]
)
async def test_batches_at_the_rate(rate: float, size: int, every_s: float) -> None:
    got = await handed(rate, 7)
    assert [b for _, b in got] == [list(range(i, min(i + size, 7))) for i in range(0, 7, size)]
    for k, (at, _) in enumerate(got):
        # The virtual clock moves in 50 ms steps here: each batch within one step of its instant.
        assert timedelta(seconds=k * every_s) <= at < timedelta(seconds=k * every_s + 0.05)


async def test_items_are_read_at_their_batch_instant() -> None:
    clock = VirtualClock(T0)
    read_at: list[datetime] = []

    def items() -> Iterator[int]:
        for i in range(3):
            read_at.append(clock.now())
            yield i

    async def consume() -> None:
        async for _ in paced(clock, 1, items()):
            pass

    task = asyncio.ensure_future(consume())
    while not task.done():
        await clock.advance(0.5)
    await task
    assert read_at == [T0, T0 + timedelta(seconds=1), T0 + timedelta(seconds=2)]


@pytest.mark.parametrize("rate", [0, -1, float("nan")])
async def test_a_rate_that_is_not_positive_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="rate must be > 0"):
        async for _ in paced(VirtualClock(T0), rate, [1]):
            pass
