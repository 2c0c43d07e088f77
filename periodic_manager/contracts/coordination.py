"""Coordination: who may enqueue (:class:`Leadership`, by partitions or not) and what wakes the
manager when schedules change (:class:`ChangeSignal`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Protocol, runtime_checkable

__all__ = [
    "ChangeCallback",
    "SignalCallback",
    "Leadership",
    "PartitionHandler",
    "PartitionLeadership",
    "ChangeSignal",
]


ChangeCallback = Callable[[bool], Awaitable[None] | None]
# A change signal's callback: the partitions whose rows changed, or None when anything may have.
SignalCallback = Callable[[frozenset[int] | None], None]


class Leadership(Protocol):
    """Decides whether this manager may enqueue."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The background loop, if any (the manager supervises it: its death is the manager's)."""
        ...

    async def start(self, on_change: ChangeCallback) -> None:
        """Begin campaigning, calling ``on_change(is_leader)`` on every change (returns at once;
        the first attempt has been made)."""
        ...

    async def stop(self) -> None:
        """Stop campaigning and release leadership (``on_change(False)`` first)."""
        ...


class PartitionHandler(Protocol):
    """What a manager does when its partitions change (``PM_COORDINATION=partitions``)."""

    async def gained(
        self,
        partitions: frozenset[int],
        fresh: frozenset[int],
        first_held: Mapping[int, datetime],
    ) -> None:
        """Leases on ``partitions`` were taken: read their rows, start after what is settled.
        ``fresh``: those of them no manager ever held (their schedules start as at a first
        start, with no look back). ``first_held``: for the others, the instant a manager first
        took each one (that manager's clock): slots due until then are owed by nobody, so their
        takeover looks back no further than it; one held before that instant was recorded
        (before migration 0022) is missing, and looks back the full grace."""
        ...

    async def releasing(self, partitions: frozenset[int]) -> None:
        """``partitions`` are handed over: stop sending for them, wait for a send under way and
        flush what was sent to the store; the leases are released once this returns."""
        ...

    def lost(self, partitions: frozenset[int]) -> None:
        """``partitions`` are no longer held (taken by another, or trust ran out): stop sending
        for them at once (never blocks)."""
        ...


@runtime_checkable
class PartitionLeadership(Leadership, Protocol):
    """Leadership by partitions: this manager leads the partitions it holds (``is_leader``
    while it holds one); :meth:`trusted` is whether it may still send for one now."""

    @property
    def count(self) -> int:
        """The number of partitions (known once started)."""
        ...

    @property
    def held(self) -> frozenset[int]:
        """The partitions whose lease is held and trusted."""
        ...

    def trusted(self, partition: int) -> bool:
        """Whether ``partition``'s lease is held and still trusted at this instant."""
        ...

    @property
    def handovers(self) -> int:
        """Partitions handed over cleanly so far."""
        ...

    def expire(self) -> None:
        """Drop at once every partition whose trust has ended (the handler's ``lost``); called
        right before every send."""
        ...

    def attach(self, handler: PartitionHandler) -> None:
        """Tell ``handler`` about every change of the partitions held (before :meth:`start`)."""
        ...


class ChangeSignal(Protocol):
    """Tells the manager that schedules changed (PostgreSQL LISTEN, say), so it syncs at once."""

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The background loop, if any (supervised as the manager's own)."""
        ...

    async def start(self, on_change: SignalCallback) -> None:
        """Begin listening, calling ``on_change(partitions)`` (never blocking) whenever
        schedules may have changed: ``partitions`` names the partitions of the rows changed when
        the signal knows them (``PM_COORDINATION=partitions``: a manager holding none of them
        does not sync), None when anything may have changed (and after any gap in listening)."""
        ...

    async def stop(self) -> None: ...
