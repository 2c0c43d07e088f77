"""A clean stop logs no ERROR: what a stop cancels, and what runs on while it takes its time."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import EntryRecord
from periodic_manager.db.dialects.postgresql import pg_connect
from periodic_manager.runtime.leadership import SessionLockLeadership
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.runtime.memory_store import MemoryRuntimeStore
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.targets.memory import MemoryTarget
from tests.support.faults import dsn

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


class SessionThatEnds(SessionLockLeadership):
    """A session lock in memory whose session can be ended (as the server ends a silent one)."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(clock=clock, poll_interval=1.0, timeout=3.0)
        self.ended = False
        self.checks_failed = 0

    async def _connect(self) -> Any:
        return object()

    async def _try_lock(self) -> bool:
        return True

    async def _prove(self) -> None:
        if self.ended:
            self.checks_failed += 1
            raise ConnectionError("connection is closed")

    async def _close(self) -> None:
        return None

    def _terminate(self) -> None:
        return None


class SlowLastCall(MemoryRuntimeStore):
    """The stop's last call to the store takes its time (unregistering removes a large start's
    entries): while it runs, the session ends and a leadership poll comes round (virtual time).
    Entries written while stopping are counted (a stop writes none: they would only be removed)."""

    def __init__(self, clock: VirtualClock, leadership: SessionThatEnds) -> None:
        super().__init__()
        self.clock = clock
        self.leadership = leadership
        self.stopping = False
        self.written_while_stopping = 0

    async def apply_entries(
        self, manager_id: str, upserts: Sequence[EntryRecord], removed: Sequence[str]
    ) -> None:
        if self.stopping:
            self.written_while_stopping += len(upserts) + len(removed)
        await super().apply_entries(manager_id, upserts, removed)

    async def unregister_manager(self, manager_id: str) -> None:
        if self.stopping:
            self.leadership.ended = True
            await self.clock.advance(2)  # two polls of the leadership loop, if it still runs
        await super().unregister_manager(manager_id)


async def test_a_stop_whose_last_publish_is_slow_logs_no_lost_leadership(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = VirtualClock(T0)
    leadership = SessionThatEnds(clock)
    store = SlowLastCall(clock, leadership)
    mgr = PeriodicTaskManager(None, MemoryTarget(), clock=clock, store=store, leadership=leadership)
    await mgr.start()
    assert mgr.is_leader
    await clock.advance(1)  # a check that proves the session
    mgr.register(PeriodicTaskConfig.create(name="late", spec="0 6 * * *", task_type="t"))
    store.stopping = True  # the change just queued is dropped by the stop, not written
    with caplog.at_level(logging.DEBUG):
        await mgr.stop()  # awaited here: the publisher gets no turn before the stop cancels it
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == [], loud
    assert leadership.checks_failed == 0  # the loop had ended before the session did
    assert leadership.ended  # the slow last call did run, after the leadership loop had ended
    assert not mgr.is_leader
    assert store.written_while_stopping == 0 and mgr.manager_id not in store.entries


async def test_a_stop_writes_no_entries_its_unregistering_removes() -> None:
    """A stop during a large takeover had a million upserts and removals queued and wrote them
    all (minutes at 1M) before unregistering, which removes the manager's entries anyway: a stop
    drops what is queued, and what was published goes with the manager's row."""
    clock = VirtualClock(T0)
    store = SlowLastCall(clock, SessionThatEnds(clock))
    mgr = PeriodicTaskManager(None, MemoryTarget(), clock=clock, store=store)
    await mgr.start()
    for i in range(50):
        mgr.register(PeriodicTaskConfig.create(name=f"s{i}", spec="0 6 * * *", task_type="t"))
    await mgr.publisher.flush()
    assert len(store.entries[mgr.manager_id]) == 50
    for i in range(50, 80):  # queued, not yet written
        mgr.register(PeriodicTaskConfig.create(name=f"s{i}", spec="0 6 * * *", task_type="t"))
    store.stopping = True
    await mgr.stop()
    assert store.written_while_stopping == 0
    assert mgr.manager_id not in store.entries and mgr.manager_id not in store.managers


async def test_a_connect_cancelled_at_any_point_leaves_nothing_logged(pg_url: str) -> None:
    """asyncpg's connect cancelled between the socket's opening and the TLS probe's answer
    leaves a failed future nobody reads ("Future exception was never retrieved", at ERROR);
    a stop cancels whatever is connecting. Every point of the opening is tried, by the number of
    event-loop turns the connect gets before the cancellation."""
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(str(context.get("message"))))
    try:
        for turns in range(12):
            connecting = asyncio.ensure_future(pg_connect(dsn(pg_url), timeout=5))
            for _ in range(turns):
                await asyncio.sleep(0)
            connecting.cancel()
            try:
                conn = await connecting
            except asyncio.CancelledError:
                pass
            else:
                await conn.close()
        # The connects left behind end by themselves (bounded by their timeout), then are read.
        left = {t for t in asyncio.all_tasks() if "connect" in repr(t.get_coro())}
        if left:
            await asyncio.wait(left, timeout=10)
        gc.collect()  # an unread failed future reports itself when collected
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert reported == []
