"""The timetable: entries grouped by the instant of their next slot.

A heap holds each *distinct* instant once and a bucket per instant lists the entries due then,
so a million daily schedules due at 03:00 cost one heap item, not a million; finding the next
instant is O(log d) for d distinct instants and taking an instant's entries is O(its size).

Entries are never searched for and removed: one that moves (advanced, replaced, unregistered) is
simply no longer valid in its old bucket, and is skipped when that bucket is taken (an entry is
valid in a bucket while its mark is not DEAD and its ``next_slot`` is that instant). After many
entries went at once (partitions handed over) :meth:`Timetable.compact` forgets their filings
then, not at their instants. Each bucket
also keeps its instant object, which its entries share (one datetime per instant, not per entry).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from datetime import datetime
from typing import Generic, Protocol, TypeVar

from periodic_manager.pacing import in_turns

# An entry's mark once it is unregistered or replaced: never valid in any bucket again.
DEAD = -2


_B = TypeVar("_B")  # a bucket of filings
_F = TypeVar("_F")  # a filing


class Timed(Protocol):
    """What the timetable needs of an entry: its next slot, and a mark the timetable sets when it
    takes the entry (DEAD: the entry is gone)."""

    next_slot: datetime | None
    mark: int


class Bucket:
    __slots__ = ("at", "entries")

    def __init__(self, at: datetime) -> None:
        self.at = at
        self.entries: list[Timed] = []


class _Filed(Generic[_B]):
    """Buckets by instant and the heap of those instants, each instant once: what the timetable
    and the send table share."""

    def __init__(self) -> None:
        self._buckets: dict[datetime, _B] = {}
        self._instants: list[datetime] = []

    def _open(self, at: datetime, bucket: _B) -> _B:
        """File ``bucket``, new, under ``at`` (and push its instant)."""
        self._buckets[at] = bucket
        heapq.heappush(self._instants, at)
        return bucket

    def _earliest(self, live: Callable[[_B, datetime], bool]) -> datetime | None:
        """The earliest instant whose bucket ``live`` accepts; those before it are dropped."""
        while self._instants:
            at = self._instants[0]
            if live(self._buckets[at], at):
                return at
            heapq.heappop(self._instants)
            del self._buckets[at]
        return None

    def _pop(self, instant: datetime) -> _B | None:
        """Remove the bucket of ``instant`` and its instant; the bucket, or None."""
        bucket = self._buckets.pop(instant, None)
        if bucket is None:
            return None
        if self._instants and self._instants[0] == instant:
            heapq.heappop(self._instants)
        else:  # not the earliest (rare): rebuild without it
            self._instants = [i for i in self._instants if i != instant]
            heapq.heapify(self._instants)
        return bucket

    async def _compact(
        self,
        filed: Callable[[_B], list[_F]],
        refile: Callable[[_B, list[_F]], None],
        valid: Callable[[_F, datetime], bool],
    ) -> int:
        dropped, emptied = await _forget_stale(self._buckets, filed, refile, valid)
        if emptied:
            self._instants = list(self._buckets)
            heapq.heapify(self._instants)
        return dropped

    def clear(self) -> None:
        self._buckets.clear()
        self._instants.clear()

    def __len__(self) -> int:
        """Distinct instants filed (including ones whose entries all moved)."""
        return len(self._instants)


class Timetable(_Filed[Bucket]):
    """Buckets of entries by instant, and the heap of those instants."""

    def __init__(self) -> None:
        super().__init__()
        self._marks = itertools.count(1)

    def add(self, entry: Timed, instant: datetime) -> None:
        """File ``entry`` under ``instant`` (and set its ``next_slot`` to the shared instant)."""
        bucket = self._buckets.get(instant) or self._open(instant, Bucket(instant))
        entry.next_slot = bucket.at
        bucket.entries.append(entry)

    def next_instant(self) -> datetime | None:
        """The earliest instant that still has a valid entry (empty buckets are dropped)."""
        return self._earliest(lambda bucket, at: any(_valid(e, at) for e in bucket.entries))

    def size(self, instant: datetime) -> int:
        """How many entries are filed under ``instant`` (an upper bound: some may be stale)."""
        bucket = self._buckets.get(instant)
        return len(bucket.entries) if bucket is not None else 0

    def take(self, instant: datetime) -> list[Timed]:
        """Remove the bucket of ``instant`` and return its valid entries, each once."""
        bucket = self._pop(instant)
        if bucket is None:
            return []
        mark = next(self._marks)
        out = []
        for entry in bucket.entries:
            if _valid(entry, instant) and entry.mark != mark:
                entry.mark = mark  # an entry filed twice under one instant is taken once
                out.append(entry)
        return out

    async def compact(self) -> int:
        """Forget the stale filings (entries moved, replaced or unregistered) now rather than
        when their instant comes, in turns with the other tasks; how many were forgotten.

        Lazy forgetting is right for the few entries a sync moves, not after a manager handed
        over most of its partitions: their entries, unregistered, stayed filed (and in memory)
        until their next slot, hours away for most. An entry filed during the pass is kept;
        what is valid is kept as it is (an entry filed twice under one instant included)."""

        def refile(bucket: Bucket, kept: list[Timed]) -> None:
            bucket.entries = kept

        return await self._compact(lambda b: b.entries, refile, _valid)


async def _forget_stale(
    buckets: dict[datetime, _B],
    filed: Callable[[_B], list[_F]],
    refile: Callable[[_B, list[_F]], None],
    valid: Callable[[_F, datetime], bool],
) -> tuple[int, bool]:
    """The pass of :meth:`Timetable.compact` and :meth:`SendTable.compact`: keep the valid
    filings of every bucket, in turns with the other tasks. A bucket taken meanwhile is left
    alone; filings appended to one meanwhile are kept; buckets left empty go. How many filings
    were forgotten, and whether a bucket went (the heap of instants is rebuilt then)."""
    dropped = 0
    for at, bucket in list(buckets.items()):
        kept: list[_F] = []
        items = filed(bucket)
        seen = len(items)  # filings appended meanwhile are after these
        async for span in in_turns(range(seen)):
            kept.extend(x for x in items[span[0] : span[-1] + 1] if valid(x, at))
        if buckets.get(at) is bucket:  # not taken meanwhile
            dropped += seen - len(kept)
            refile(bucket, kept + filed(bucket)[seen:])
    empty = [at for at, bucket in buckets.items() if not filed(bucket)]
    for at in empty:
        del buckets[at]
    return dropped, bool(empty)


def _valid(entry: Timed, instant: datetime) -> bool:
    return entry.mark != DEAD and entry.next_slot == instant


_Sends = list[tuple[Timed, datetime]]  # a send instant's filings: (entry, its nominal slot)


class SendTable(_Filed[_Sends]):
    """Entries with ``options.jitter``, filed by *send* instant (slot + offset) with their
    nominal slot (:mod:`periodic_manager.schedules.jitter`).

    Apart from the timetable, so entries without jitter take exactly its path. Sends spread
    out, so buckets are small and are not staged. An entry is valid in a bucket while it is not
    DEAD and its ``next_slot`` is still the nominal slot it was filed with; one instant may hold
    entries of different nominal slots (the scheduler sends them as one batch per slot).
    """

    def add(self, entry: Timed, slot: datetime, at: datetime) -> None:
        """File ``entry`` (next slot ``slot``) under its send instant ``at``."""
        bucket = self._buckets.get(at)
        if bucket is None:
            bucket = self._open(at, [])
        bucket.append((entry, slot))

    def next_instant(self) -> datetime | None:
        """The earliest send instant that still has a valid entry."""
        return self._earliest(lambda bucket, _at: any(_valid(e, slot) for e, slot in bucket))

    def take(self, instant: datetime) -> list[Timed]:
        """Remove the bucket of ``instant`` (the earliest) and return its valid entries, once."""
        bucket = self._pop(instant)
        if bucket is None:
            return []
        seen: set[int] = set()
        out = []
        for entry, slot in bucket:
            if _valid(entry, slot) and id(entry) not in seen:
                seen.add(id(entry))
                out.append(entry)
        return out

    async def compact(self) -> int:
        """:meth:`Timetable.compact` for the send instants."""

        def refile(bucket: _Sends, kept: _Sends) -> None:
            bucket[:] = kept

        return await self._compact(lambda b: b, refile, lambda item, _at: _valid(*item))
