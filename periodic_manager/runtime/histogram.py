"""A histogram for Prometheus that takes a count at once (:class:`Histogram`)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence


class Histogram:
    """Cumulative-on-export histogram: per-bucket counts plus sum, updated with a count at once
    (a burst's lateness is folded per value, not observed once per slot)."""

    __slots__ = ("buckets", "counts", "total")

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += n
        self.total += value * n

    def export(self) -> tuple[list[tuple[str, float]], float]:
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            acc += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(acc)))
        return out, self.total
