"""In-process managers under test: leadership the test hands out (a manager built with
``ManualLeader(True)`` leads, one with ``ManualLeader(False)`` stands by until the test calls
``leadership._set(True)``), and a settle of the virtual clock for several managers."""

from __future__ import annotations

from typing import Any

from periodic_manager.clock import VirtualClock
from periodic_manager.runtime.leadership import AlwaysLeader
from periodic_manager.runtime.manager import PeriodicTaskManager


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
