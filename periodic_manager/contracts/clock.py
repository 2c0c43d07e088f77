"""The time seam: every part reads the instant, and waits, through a :class:`Clock`."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Protocol

__all__ = [
    "Clock",
]


class Clock(Protocol):
    """Source of time for the scheduler and the manager."""

    def now(self) -> datetime:
        """The current instant, an aware UTC datetime (the wall clock: slots are judged by it)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that only moves forward, at the pace of real time, whatever the
        wall clock does (a step back or forward, a skew): leases, their trust and every wait on
        another holder's expiry are measured on it. Only differences of two readings mean
        anything."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds`` of this clock's time have passed (cancellable)."""
        ...

    async def sleep_until(self, instant: datetime) -> None:
        """Return once this clock reaches ``instant`` (cancellable). The remaining time is
        measured when the timer is armed, so work queued before the sleeper first runs does not
        make it late."""
        ...

    async def wait_until(self, event: asyncio.Event, instant: datetime) -> bool:
        """Wait for ``event`` until this clock reaches ``instant`` at most; True when the event
        was set (cancellable). The real clock waits without a task of its own."""
        ...
