"""In-process managers under test: leadership the test hands out (a manager built with
``ManualLeader(True)`` leads, one with ``ManualLeader(False)`` stands by until the test calls
``leadership._set(True)``), a settle of the virtual clock for several managers, and a fleet of
managers built from settings, sharing partitions on one virtual clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.clock import VirtualClock
from periodic_manager.db.engine import create_engine
from periodic_manager.runtime.assemble import build_manager
from periodic_manager.runtime.leadership import AlwaysLeader
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.runtime.partitions import PartitionLeases
from periodic_manager.settings import Settings


class ManualLeader(AlwaysLeader):
    """Leadership the test hands out (no election: ``_set`` changes it, as an election would)."""

    def __init__(self, leader: bool) -> None:
        super().__init__()
        self._initial = leader

    async def start(self, on_change: Any) -> None:
        self._on_change = on_change
        await self._set(self._initial)


async def settle(clock: VirtualClock, *managers: PeriodicTaskManager) -> None:
    """Let every manager finish what is due at the clock's present instant (no time passes)."""

    async def done() -> None:
        for m in managers:
            await m.wait_settled(clock.now())

    await clock.advance(0, settle=done)


class Fleet:
    """Managers built from settings (partition leases) on a shared virtual clock, each with its
    own engine, started and stopped by name."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.managers: dict[str, PeriodicTaskManager] = {}
        self.engines: list[AsyncEngine] = []

    async def start(self, name: str, settings: Settings) -> PeriodicTaskManager:
        engine = create_engine(settings.database_url)
        self.engines.append(engine)
        mgr = build_manager(settings, engine, clock=self.clock)
        assert isinstance(mgr.leadership, PartitionLeases) and mgr.holding is not None
        self.managers[name] = mgr
        await mgr.start()
        await self.settle()
        return mgr

    async def stop(self, name: str) -> None:
        await self.managers.pop(name).stop()

    async def settle(self) -> None:
        """Every target ping, lease round and partition takeover under way is over, every slot
        due now handled (a send retrying sleeps on the virtual clock: wait_settled counts it
        handled)."""
        for _ in range(3):  # a round may start a takeover, a takeover ends before a round
            for m in self.managers.values():
                assert isinstance(m.leadership, PartitionLeases) and m.holding is not None
                if m.target_health is not None:
                    await m.target_health.quiet()
                await m.leadership.quiet()
                await m.holding.quiet()
                await m.wait_settled(self.clock.now())

    async def drive(self, seconds: float) -> None:
        for _ in range(round(seconds * 2)):
            await self.clock.advance(0.5, settle=self.settle)

    async def until(self, done: Callable[[], bool], seconds: float) -> float:
        """Drive in half seconds until ``done()``; the virtual seconds it took."""
        start = self.clock.now()
        for _ in range(round(seconds * 2)):
            if done():
                break
            await self.clock.advance(0.5, settle=self.settle)
        assert done(), f"not within {seconds} s"
        return (self.clock.now() - start).total_seconds()

    async def close(self) -> None:
        for name in list(self.managers):
            await self.stop(name)
        for e in self.engines:
            await e.dispose()
