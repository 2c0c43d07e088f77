"""pm_backfill_slots (periodic_manager/db/backfill_slots.py) on every database: two backfills
claiming overlapping slots at once (each on a connection of its own) share them, none twice; a
claim whose backfill died is taken over after STALE, not before; a limited schedule's runs left
are shared by racing claims; a slot given up is claimable again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.db import backfill_slots
from periodic_manager.db.engine import create_engine

T0 = datetime(2030, 1, 1, tzinfo=UTC)
SLOTS = [T0 + timedelta(minutes=k) for k in range(200)]


@pytest.fixture
async def engines(db_url: str) -> AsyncIterator[tuple[AsyncEngine, AsyncEngine]]:
    a, b = create_engine(db_url), create_engine(db_url)  # two processes' pools
    try:
        yield a, b
    finally:
        await a.dispose()
        await b.dispose()


async def test_racing_claims_share_the_slots_none_twice(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    a, b = engines
    for _ in range(3):  # rounds: the interleaving differs each time
        key = f"k{_}"
        got = await asyncio.gather(
            *[
                backfill_slots.claim(eng, key, "j", SLOTS[i::4] + SLOTS[j::4], f"o{n}", T0, None)
                for n, (eng, i, j) in enumerate([(a, 0, 1), (b, 1, 2), (a, 2, 3), (b, 3, 0)])
            ]
        )
        mine = [s for g in got for s in g.mine]
        assert sorted(mine) == SLOTS  # each slot once, every one
        assert all(len(g.mine) + len(g.known) == 100 for g in got)


async def test_a_claim_of_a_dead_backfill_is_taken_over_after_stale(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    a, _ = engines
    first = await backfill_slots.claim(a, "k", "j", SLOTS[:10], "dead", T0, None)
    assert first.mine == SLOTS[:10]  # never finished: the backfill died
    soon = await backfill_slots.claim(
        a, "k", "j", SLOTS[:10], "next", T0 + timedelta(minutes=1), None
    )
    assert (soon.mine, soon.known) == ([], set(SLOTS[:10]))
    later = T0 + backfill_slots.STALE + timedelta(seconds=1)
    taken = await backfill_slots.claim(a, "k", "j", SLOTS[:10], "next", later, None)
    assert taken.mine == SLOTS[:10]
    await backfill_slots.finish(a, "k", "next", SLOTS[:5], SLOTS[5:10], later, limited=False)
    much_later = later + backfill_slots.STALE * 10
    again = await backfill_slots.claim(a, "k", "j", SLOTS[:10], "third", much_later, None)
    assert again.mine == SLOTS[5:10]  # given up: claimable; sent ones never again


async def test_racing_claims_of_a_limited_schedule_share_its_runs_left(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    a, b = engines
    got = await asyncio.gather(
        backfill_slots.claim(a, "lim", "j", SLOTS[:50], "x", T0, 3),
        backfill_slots.claim(b, "lim", "j", SLOTS[25:75], "y", T0, 3),
    )
    assert sum(len(g.mine) for g in got) == 3
    assert (
        sum(g.over_limit for g in got)
        + sum(len(g.mine) for g in got)
        + sum(len(g.known) for g in got)
        == 100
    )
    mine = [s for g in got for s in g.mine]
    await backfill_slots.finish(
        a, "lim", "x", [s for s in mine if s in got[0].mine], [], T0, limited=True
    )
    failed = got[1].mine
    await backfill_slots.finish(b, "lim", "y", [], failed, T0, limited=True)  # their runs come back
    more = await backfill_slots.claim(a, "lim", "j", SLOTS[100:110], "z", T0, 3)
    assert len(more.mine) == len(failed)
