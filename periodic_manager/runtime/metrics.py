"""Prometheus metrics of one manager, in a registry of its own (no global state).

The manager calls two narrow hooks: :meth:`ManagerMetrics.observe_runs` with every batch of slot
outcomes (the same batches it records in its store) and :meth:`ManagerMetrics.time_sync` around
each sync. Gauges (entries, leader flag, last sync) are read from the manager when scraped.

Counters and the lateness histogram are kept in plain dicts and folded per batch: a burst of
100,000 slots due at one instant costs one dict update per (queue, target, status) and per
lateness bucket, not one lock per slot as a ``prometheus_client.Histogram.observe`` per task
would. Every schedule is counted in those aggregates; a bounded few also get series of their own
(:mod:`periodic_manager.runtime.schedule_series`).

``prometheus_client`` is imported when the registry is first asked for (a metrics port, the API's
``/metrics``, a test): a manager nobody scrapes counts in its dicts and never loads it.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from periodic_manager.contracts import SENT, SLOT_REASONS, CountsDeliveries, RunRecord
from periodic_manager.runtime.histogram import Histogram
from periodic_manager.runtime.schedule_series import ScheduleSeries

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

PREFIX = "periodic_manager"
QUEUE_MEMO_MAX = 100_000  # schedule keys whose queue is remembered between syncs
QUEUE_MEMO_BATCH = 1000  # runs of a batch above which their keys are not remembered (a burst)
LATENESS_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
SYNC_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
UNKNOWN_QUEUE = "unknown"
# What a target's own deliveries came to in this manager (contracts.CountsDeliveries: the http
# target's done, retried and dead; dead ones are the dead letters).
_DELIVERIES = (
    f"{PREFIX}_target_deliveries",
    "deliveries a target made beside the manager, by outcome (done, retried, dead: a dead letter)",
    None,
    ["outcome"],
)


# What a schedule's runs are counted by: its queue and target, and whether it opted in to series
# of its own (``options.metrics``). A plain tuple: a burst makes one per run.
Labels = tuple[str, str, bool]

UNKNOWN: Labels = (UNKNOWN_QUEUE, "unknown", False)


class _Entry(Protocol):
    @property
    def key(self) -> str: ...

    @property
    def config(self) -> Any: ...


class ManagerView(Protocol):
    """What the metrics read from a manager at scrape time."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def last_sync_at(self) -> datetime | None: ...

    @property
    def last_sync_error(self) -> str | None: ...

    @property
    def partitions(self) -> frozenset[int]: ...

    @property
    def partition_handovers(self) -> int: ...

    @property
    def signals_ignored(self) -> int: ...

    @property
    def standing_down(self) -> str | None: ...

    @property
    def stand_downs(self) -> int: ...

    @property
    def clock_offset_s(self) -> float | None: ...

    @property
    def default_target(self) -> str: ...

    def entries(self) -> Sequence[_Entry]: ...

    def entry(self, key: str) -> _Entry | None: ...


class ManagerMetrics:
    """Metrics of one manager (a prometheus ``Collector``); ``registry`` is what ``/metrics`` or a
    metrics port serves."""

    def __init__(
        self,
        manager: ManagerView,
        registry: CollectorRegistry | None = None,
        *,
        schedules: int = 100,
    ) -> None:
        self._manager = manager
        self._lock = threading.Lock()  # scrapes may come from another thread (metrics port)
        self._runs: dict[tuple[str, str, str], int] = {}  # (queue, target, status) -> count
        # (queue, target, status, reason) -> count
        self._reasons: dict[tuple[str, str, str, str], int] = {}
        # (queue, target) -> lateness of enqueued slots
        self._lateness: dict[tuple[str, str], Histogram] = {}
        self.schedules = ScheduleSeries(schedules)  # PM_METRICS_SCHEDULES
        self._sync = Histogram(SYNC_BUCKETS_S)
        self._syncs: dict[str, int] = {"ok": 0, "error": 0}
        self._lost: dict[str, int] = {}  # target -> times its broker lost its data
        self._labels: dict[str, Labels] = {}  # schedule key -> labels, forgotten after syncs
        self._registry = registry
        if registry is not None:
            registry.register(self)

    @property
    def registry(self) -> CollectorRegistry:
        """The registry serving these metrics, made (and ``prometheus_client`` imported) at the
        first call."""
        with self._lock:
            if self._registry is None:
                from prometheus_client import CollectorRegistry

                self._registry = CollectorRegistry(auto_describe=True)
                self._registry.register(self)
            return self._registry

    # -- hooks called by the manager -------------------------------------------------------------

    def observe_runs(self, runs: Sequence[RunRecord]) -> None:
        """Count a batch of slot outcomes by queue, target and status (and reason); lateness of
        enqueued slots; the schedules watched on their own."""
        counts: dict[tuple[str, str, str], int] = {}
        reasons: dict[tuple[str, str, str, str], int] = {}
        lateness: dict[tuple[str, str, float], int] = {}
        # Runs of the schedules watched on their own (opted in, or ranked already), and the
        # others late enough to rank: the batch's latest of them are offered, not every run.
        series = self.schedules
        known, floor = series.slots, series.floor()
        mine: list[tuple[RunRecord, float, bool]] = []
        rivals: list[tuple[float, int]] = []
        # A burst's runs (one per schedule) are looked up without being remembered: the memo
        # would keep a key string per schedule, made during the burst, and with it the pools of
        # everything the burst freed around them (about 100 B of RSS per task sent).
        memo: dict[str, Labels] = self._labels if len(runs) <= QUEUE_MEMO_BATCH else {}
        for index, run in enumerate(runs):
            queue, target, opted = self._labels_of(run.schedule_key, memo)
            key = (queue, target, run.status)
            counts[key] = counts.get(key, 0) + 1
            if run.reason is not None:
                why = (queue, target, run.status, run.reason)
                reasons[why] = reasons.get(why, 0) + 1
            late = max(0.0, (run.at.astimezone(UTC) - run.slot.astimezone(UTC)).total_seconds())
            if run.status in SENT:
                lateness[(queue, target, late)] = lateness.get((queue, target, late), 0) + 1
            if opted or run.name in known:
                mine.append((run, late, opted))
            elif late > floor:
                rivals.append((late, index))
        with self._lock:
            for counted, n in counts.items():
                self._runs[counted] = self._runs.get(counted, 0) + n
            for reasoned, n in reasons.items():
                self._reasons[reasoned] = self._reasons.get(reasoned, 0) + n
            for (queue, target, late), n in lateness.items():
                hist = self._lateness.get((queue, target))
                if hist is None:
                    hist = self._lateness[(queue, target)] = Histogram(LATENESS_BUCKETS_S)
                hist.observe(late, n)
            latest = heapq.nlargest(series.limit, rivals)
            series.count(mine, [(runs[index], late) for late, index in latest])

    def broker_data_lost(self, target: str) -> None:
        """Count a loss of a target broker's data (its sentinel key disappeared)."""
        with self._lock:
            self._lost[target] = self._lost.get(target, 0) + 1

    @contextmanager
    def time_sync(self) -> Iterator[None]:
        """Time one sync (its outcome is read from the manager's ``last_sync_error``)."""
        start = time.perf_counter()  # a duration, not an instant: no clock involved
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            ok = self._manager.last_sync_error is None
            with self._lock:
                self._sync.observe(elapsed)
                self._syncs["ok" if ok else "error"] += 1
                self._labels.clear()  # entries may have changed queue, target or options

    # -- scrape --------------------------------------------------------------------------------

    def _labels_of(self, schedule_key: str, memo: dict[str, Labels]) -> Labels:
        """The labels of a schedule's runs: looked up once per key (``memo``), not by walking
        every entry (with a million entries, that walk on the dispatch path made the first slot
        after a sync late)."""
        labels = memo.get(schedule_key)
        if labels is None:
            entry = self._manager.entry(schedule_key)
            if entry is None:
                labels = UNKNOWN
            else:
                options = entry.config.options
                target = options.get("target") or self._manager.default_target
                labels = (str(entry.config.queue), str(target), options.get("metrics") is True)
            if len(memo) >= QUEUE_MEMO_MAX:
                memo.clear()
            memo[schedule_key] = labels
        return labels

    def describe(self) -> Iterator[Metric]:
        """The metric names, without reading the manager."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        yield from self._counters()
        yield from _schedule_families()
        for name, text in _READ_COUNTERS.items():
            yield CounterMetricFamily(f"{PREFIX}_{name}", text)
        for name, text in _GAUGES.items():
            yield GaugeMetricFamily(f"{PREFIX}_{name}", text)
        yield CounterMetricFamily(*_DELIVERIES)

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        m = self._manager
        runs, by_reason, lateness, sync, syncs, lost = self._counters()
        own, own_late = _schedule_families()
        with self._lock:
            for (queue, target, status), n in sorted(self._runs.items()):
                runs.add_metric([queue, target, status], float(n))
            for (queue, target, status, reason), n in sorted(self._reasons.items()):
                by_reason.add_metric([queue, target, status, reason], float(n))
            for (queue, target), of_queue in sorted(self._lateness.items()):
                buckets, total = of_queue.export()
                lateness.add_metric([queue, target], buckets, total)
            watched = self.schedules
            for name in sorted(watched.names()):
                for (status, reason), n in sorted(watched.slots[name].items()):
                    own.add_metric([name, status, reason], float(n))
                if (of_schedule := watched.lateness.get(name)) is not None:
                    buckets, total = of_schedule.export()
                    own_late.add_metric([name], buckets, total)
            buckets, total = self._sync.export()
            sync.add_metric([], buckets, total)
            for result, n in sorted(self._syncs.items()):
                syncs.add_metric([result], float(n))
            for target, n in sorted(self._lost.items()):
                lost.add_metric([target], float(n))
        yield from (runs, by_reason, lateness, sync, syncs, lost, own, own_late)
        read = {
            "partition_handovers": m.partition_handovers,
            "change_signals_ignored": m.signals_ignored,
            "target_stand_downs": m.stand_downs,
        }
        for name, text in _READ_COUNTERS.items():
            yield CounterMetricFamily(f"{PREFIX}_{name}", text, value=float(read[name]))
        last = m.last_sync_at
        values = {
            "entries": float(_entry_count(m)),
            "leader": float(m.is_leader),
            "last_sync_timestamp_seconds": last.timestamp() if last is not None else 0.0,
            "last_sync_ok": float(m.last_sync_error is None),
            "partitions": float(len(m.partitions)),
            "target_down": float(m.standing_down is not None),
            "clock_offset_seconds": math.nan if (off := m.clock_offset_s) is None else off,
        }
        for name, text in _GAUGES.items():
            yield GaugeMetricFamily(f"{PREFIX}_{name}", text, value=values[name])
        deliveries = CounterMetricFamily(*_DELIVERIES)
        sender = getattr(m, "target", None)
        if isinstance(sender, CountsDeliveries):
            for outcome, n in sorted(sender.delivery_counts().items()):
                deliveries.add_metric([outcome], float(n))
        yield deliveries

    @staticmethod
    def _counters() -> tuple[
        CounterMetricFamily,
        CounterMetricFamily,
        HistogramMetricFamily,
        HistogramMetricFamily,
        CounterMetricFamily,
        CounterMetricFamily,
    ]:
        from prometheus_client.core import CounterMetricFamily as Counter
        from prometheus_client.core import HistogramMetricFamily as Histo

        return (
            _made(Counter, _SLOTS),
            _made(Counter, _BY_REASON),
            _made(Histo, _LATENESS),
            _made(Histo, _SYNC),
            _made(Counter, _SYNCS),
            _made(Counter, _LOST),
        )


def _schedule_families() -> tuple[CounterMetricFamily, HistogramMetricFamily]:
    """The series of single schedules (options.metrics, or among the latest PM_METRICS_SCHEDULES:
    :mod:`periodic_manager.runtime.schedule_series`)."""
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

    return _made(CounterMetricFamily, _SCHEDULE_SLOTS), _made(
        HistogramMetricFamily, _SCHEDULE_LATENESS
    )


# The families this manager counts itself: name (after the prefix), help, labels.
Family = tuple[str, str, tuple[str, ...]]
_SLOTS: Family = (
    "slots",
    "Slots handled by this manager, by queue, target and outcome "
    "(enqueued, duplicate, resent, skipped, failed, held)",
    ("queue", "target", "status"),
)
_BY_REASON: Family = (
    "slots_by_reason",
    "Slots skipped, held or failed, or sent for a reason, by queue, target, outcome and reason "
    f"({', '.join(SLOT_REASONS)})",
    ("queue", "target", "status", "reason"),
)
_LATENESS: Family = (
    "enqueue_lateness_seconds",
    "Seconds between a slot and its enqueue, durably in the target (enqueued and duplicate slots)",
    ("queue", "target"),
)
_SYNC: Family = ("sync_duration_seconds", "Duration of syncs", ())
_SYNCS: Family = ("syncs", "Syncs by result", ("result",))
_LOST: Family = (
    "broker_data_lost",
    "Times a target's broker was found to have lost its data (a Redis restarted without "
    "persistence, flushed, or failed over to an empty replica)",
    ("target",),
)
_SCHEDULE_SLOTS: Family = (
    "schedule_slots",
    "Slots of one schedule by outcome and reason (none: no reason); only schedules with "
    "options.metrics true and the PM_METRICS_SCHEDULES latest ones",
    ("schedule", "status", "reason"),
)
_SCHEDULE_LATENESS: Family = (
    "schedule_lateness_seconds",
    "Seconds between a slot of one schedule and its enqueue (same schedules as "
    "periodic_manager_schedule_slots)",
    ("schedule",),
)


M = TypeVar("M", "CounterMetricFamily", "HistogramMetricFamily")


def _made(kind: type[M], family: Family) -> M:
    """An empty ``kind`` of ``family`` (its full name, help and labels)."""
    name, text, labels = family
    return kind(f"{PREFIX}_{name}", text, labels=list(labels))


_GAUGES = {
    "entries": "Entries registered in the scheduler",
    "leader": "1 if this manager leads",
    "last_sync_timestamp_seconds": "Unix time of the last successful sync (0: none yet)",
    "last_sync_ok": "1 if the last sync succeeded",
    "partitions": "Partitions this manager holds (PM_COORDINATION=partitions; 0 with one leader)",
    "target_down": "1 while this manager stands down: every target failed PM_TARGET_PING_FAILURES "
    "pings in a row, so it holds no partition and does not lead",
    "clock_offset_seconds": "Seconds this manager's wall clock is ahead of the database's, as "
    "last measured (negative: behind; NaN: not measured)",
}


# Counters the manager keeps itself, read when scraped.
_READ_COUNTERS = {
    "partition_handovers": "Partitions this manager handed over cleanly (to a joining manager, or on stop)",
    "change_signals_ignored": "Change signals this manager did not sync on: they named only "
    "partitions it does not hold (PM_COORDINATION=partitions)",
    "target_stand_downs": "Times this manager stood down because every target failed its pings "
    "(it handed over its partitions or leadership until a target answered)",
}


def _entry_count(manager: ManagerView) -> int:
    # A scrape from the metrics port's thread may race the event loop changing the entries.
    for _ in range(3):
        try:
            return len(manager.entries())
        except RuntimeError:
            continue
    return 0
