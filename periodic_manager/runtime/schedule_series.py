"""Metric series of single schedules, with a bounded count: a million schedules never make a
million series.

A schedule has series of its own (``schedule="<name>"``: its slots by status and reason, its
lateness) when it opts in (``options.metrics: true``), or while it is among the ``limit``
(``PM_METRICS_SCHEDULES``) others with the largest lateness this manager has seen: the late
ones are the ones to look at. One that falls out of those loses its series (Prometheus sees them
end); the aggregates per queue and target (:mod:`periodic_manager.runtime.metrics`) count every
schedule all along.

A batch offers only its ``limit`` latest runs of schedules not watched yet (and only those later
than the current floor), so a burst of 100,000 runs costs one comparison per run and a few
hundred heap operations.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

from periodic_manager.contracts import SENT, RunRecord
from periodic_manager.runtime.histogram import Histogram

# Coarser than the aggregates': a schedule's own histogram is 9 series, 100 of them 900.
SCHEDULE_BUCKETS_S = (0.001, 0.01, 0.1, 1.0, 10.0, 60.0)
NO_REASON = "none"


class ScheduleSeries:
    """The per-schedule counts and lateness of the schedules watched (see the module doc)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.slots: dict[str, dict[tuple[str, str], int]] = {}  # name -> (status, reason) -> n
        self.lateness: dict[str, Histogram] = {}  # name -> lateness of its sent slots
        self._worst: dict[str, float] = {}  # ranked (not opted-in) name -> worst lateness seen
        self._heap: list[tuple[float, str]] = []  # (worst, name), stale pairs skipped on pop

    def count(
        self,
        mine: Iterable[tuple[RunRecord, float, bool]],
        rivals: Iterable[tuple[RunRecord, float]],
    ) -> None:
        """Count the runs of a batch: ``mine``, (run, lateness, opted in) of the schedules
        watched (opted in, or ranked already); ``rivals``, (run, lateness) of others, each one
        counted if its lateness ranks it among the latest now."""
        for run, late, opted in mine:
            if opted or self._ranked(run.name, late):
                self._add(run, late)
        for run, late in rivals:
            if self._ranked(run.name, late):
                self._add(run, late)

    def observe(
        self, name: str, opted: bool, status: str, reason: str | None, late: float, sent: bool
    ) -> None:
        """One run of schedule ``name``: counted if it is watched (or now becomes so)."""
        if opted or self._ranked(name, late):
            self._counted(name, status, reason, late, sent)

    def floor(self) -> float:
        """The lateness a schedule not watched must exceed to be ranked: the smallest worst
        lateness among the ranked ones once there are ``limit`` of them (-inf before; +inf
        with no ranking at all)."""
        if self.limit <= 0:
            return math.inf
        if len(self._worst) < self.limit:
            return -math.inf
        return self._floor()

    def _add(self, run: RunRecord, late: float) -> None:
        self._counted(run.name, run.status, run.reason, late, run.status in SENT)

    def _counted(self, name: str, status: str, reason: str | None, late: float, sent: bool) -> None:
        counts = self.slots.get(name)
        if counts is None:
            counts = self.slots[name] = {}
        key = (status, reason or NO_REASON)
        counts[key] = counts.get(key, 0) + 1
        if sent:
            hist = self.lateness.get(name)
            if hist is None:
                hist = self.lateness[name] = Histogram(SCHEDULE_BUCKETS_S)
            hist.observe(late)

    def names(self) -> Iterable[str]:
        return self.slots.keys()

    def _ranked(self, name: str, late: float) -> bool:
        """Whether ``name`` is among the ``limit`` latest after a run ``late`` seconds late."""
        worst = self._worst.get(name)
        if worst is not None:
            if late > worst:
                self._worst[name] = late
                heapq.heappush(self._heap, (late, name))
            return True
        if self.limit <= 0:
            return False
        if len(self._worst) >= self.limit:
            if late <= self._floor():
                return False
            self._evict()
        self._worst[name] = late
        heapq.heappush(self._heap, (late, name))
        return True

    def _floor(self) -> float:
        """The smallest worst lateness among the ranked names (stale heap pairs dropped)."""
        heap = self._heap
        while heap and self._worst.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else 0.0

    def _evict(self) -> None:
        """Drop the ranked name with the smallest worst lateness, and its series."""
        self._floor()
        _, name = heapq.heappop(self._heap)
        del self._worst[name]
        self.slots.pop(name, None)
        self.lateness.pop(name, None)
