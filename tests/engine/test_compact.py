"""Compacting the entries after many went at once (a manager handing partitions over): the
timetables forget the filings of entries that moved or went (otherwise held, with the entries,
until their instant), the map of entries gets a table sized for what is left, and what is
still valid stays filed as it was, an entry filed during the pass included."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime

from periodic_manager.clock import VirtualClock
from periodic_manager.engine.entries import Entries
from periodic_manager.schedules.definition import PeriodicTaskConfig

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
MANY = 3000  # several slices of a pass in turns


def cfg(i: int, spec: str = "@every 3600s", **options: object) -> PeriodicTaskConfig:
    return PeriodicTaskConfig.create(
        name=f"j{i}", spec=spec, task_type="demo.task", schedule_id=i, options=options or None
    )  # type: ignore[arg-type]


async def test_compact_forgets_stale_filings_and_shrinks_the_map_in_place() -> None:
    entries = Entries(VirtualClock(T0), lambda: None)
    for i in range(1, MANY + 1):
        entries.register(cfg(i), synced=True, now=T0)
    for i in range(MANY + 1, MANY + 11):
        entries.register(cfg(i, jitter=600), synced=True, now=T0)
    at = entries.timetable.next_instant()
    send = entries.sends.next_instant()
    assert at is not None and send is not None
    for i in range(1, MANY + 1):
        if i % 4:  # three in four go (a share handed over)
            entries.unregister(i)
    for i in range(MANY + 1, MANY + 11, 2):
        entries.unregister(i)
    entries.register(cfg(4, "@every 7200s"), synced=True, now=T0)  # replaced: its filing moves
    held = entries.held()
    room = sys.getsizeof(held)
    assert entries.timetable.size(at) == MANY  # before: every filing is still there

    late = cfg(MANY + 100)
    compacting = asyncio.ensure_future(entries.compact())
    await asyncio.sleep(0)  # the first slice is done; an entry registered meanwhile...
    assert not compacting.done()
    entries.register(late, synced=True, now=T0)
    forgotten = await compacting

    left = [i for i in range(4, MANY + 1, 4) if i != 4]
    assert forgotten == MANY - len(left) + 5  # ... is kept; the stale filings are gone
    assert entries.timetable.size(at) == len(left) + 1
    assert entries.held() is held and sys.getsizeof(held) < room / 3  # the same map, smaller
    assert len(held) == len(left) + 1 + 5 + 1
    # What is filed is taken as before (each valid entry once), the jittered ones too.
    assert entries.timetable.next_instant() == at
    assert sorted(e.ident for e in entries.timetable.take(at)) == [*left, MANY + 100]  # type: ignore[attr-defined]
    taken = set()
    while (send := entries.sends.next_instant()) is not None:
        taken |= {e.ident for e in entries.sends.take(send)}  # type: ignore[attr-defined]
    assert taken == set(range(MANY + 2, MANY + 11, 2))


async def test_compact_leaves_alone_an_instant_taken_meanwhile_and_drops_emptied_ones() -> None:
    entries = Entries(VirtualClock(T0), lambda: None)
    for i in range(1, MANY + 1):
        entries.register(cfg(i, "@every 3600s" if i % 2 else "@every 5400s"), synced=True, now=T0)
    (first,) = {entries.get(i).next_slot for i in range(1, MANY + 1, 2)}  # type: ignore[union-attr]
    (later,) = {entries.get(i).next_slot for i in range(2, MANY + 1, 2)}  # type: ignore[union-attr]
    assert first is not None and later is not None and first < later
    for i in range(1, MANY + 1):
        if i % 2 == 0 or i < MANY // 2:
            entries.unregister(i)  # the later instant empties; the first keeps some
    compacting = asyncio.ensure_future(entries.compact())
    await asyncio.sleep(0)
    taken = entries.timetable.take(first)  # the scheduler takes the first instant meanwhile
    await compacting
    assert len(taken) == len([i for i in range(MANY // 2, MANY + 1) if i % 2])
    assert len(entries.timetable) == 0 and entries.timetable.next_instant() is None
