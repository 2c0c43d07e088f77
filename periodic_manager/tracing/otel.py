"""The OpenTelemetry SDK behind ``PM_OTEL``: the provider and exporter the ``OTEL_*`` variables
describe, the ids decided before a batch is sent, the spans made after (see the package's
docstring for their shape). Imported only when tracing is on (needs the ``otel`` extra).

The slot and batch spans are built as finished :class:`ReadableSpan` values with the ids and
timestamps decided earlier and handed to the batch processor, the way the SDK's own spans end:
a live span costs ~70 us, which a burst of 100,000 slots cannot pay; a finished one ~10 us, and
their number is bounded per batch (``SLOT_SPANS``). The API's spans (FastAPI instrumentation) go
through the same provider and exporter.
"""

from __future__ import annotations

import logging
import os
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from random import getrandbits
from typing import TYPE_CHECKING, Any

from periodic_manager.errors import ConfigError
from periodic_manager.schedules.instants import slot_text

try:
    from opentelemetry import context as otel_context
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import (
        NonRecordingSpan,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceFlags,
        set_span_in_context,
    )
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ConfigError(
        "PM_OTEL", f"tracing needs the otel extra (pip install 'periodic-manager[otel]'): {exc}"
    ) from None

from periodic_manager.version import __version__

if TYPE_CHECKING:
    from periodic_manager.contracts import Clock, EnqueueResult, Prepared, StagedTarget, Task

log = logging.getLogger(__name__)

SLOT_SPANS = 100  # slots of a batch with a span of their own (and as many more not enqueued)
NAMES_SHOWN = 32  # schedule names and queues listed on a batch span
SEND = "pm.send"
RETRY = "pm.retry"
SLOT = "pm.slot"
_MASK64 = (1 << 64) - 1
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_SENT_KEPT = 4096  # traces whose send span was made (a later call of theirs is a retry)


def _ns(at: datetime) -> int:
    return (at - _EPOCH) // _US * 1000


def _span_id(avoid: int) -> int:
    while True:
        span_id = getrandbits(64)
        if span_id and span_id != avoid:
            return span_id


def _exporters() -> list[SpanExporter]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (otlp, console, none; default otlp)."""
    names = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    out: list[SpanExporter] = []
    for name in (n.strip() for n in names.split(",")):
        if name == "otlp":
            out.append(_otlp())
        elif name == "console":
            out.append(ConsoleSpanExporter())
        elif name != "none":
            raise ConfigError("OTEL_TRACES_EXPORTER", f"{name!r}: use otlp, console or none")
    return out


def _otlp() -> SpanExporter:
    """The OTLP exporter of ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL`` (default http/protobuf);
    endpoint, headers, timeout, compression and certificates are read by the exporter itself."""
    var = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    protocol = os.environ.get(var)
    if not protocol:
        var = "OTEL_EXPORTER_OTLP_PROTOCOL"
        protocol = os.environ.get(var) or "http/protobuf"
    protocol = protocol.strip().lower()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            raise ConfigError(
                var, "grpc needs the package opentelemetry-exporter-otlp-proto-grpc"
            ) from None
        exporter: SpanExporter = GrpcExporter()
        return exporter
    raise ConfigError(var, f"{protocol!r}: use http/protobuf or grpc (http/json is not supported)")


class SlotTracing:
    """Decides the trace of each batch before it is sent and records its spans after."""

    def __init__(self, provider: TracerProvider, processors: Sequence[SpanProcessor]) -> None:
        self.provider = provider
        self._processors = list(processors)  # none: OTEL_TRACES_EXPORTER=none (ids only)
        self._sampler = provider.sampler
        self._resource = provider.resource
        self._scope = InstrumentationScope("periodic_manager", __version__)
        self._sent: OrderedDict[int, None] = OrderedDict()

    @classmethod
    def from_env(cls, service_name: str = "periodic-manager") -> SlotTracing:
        """Provider, sampler (``OTEL_TRACES_SAMPLER``), resource (``OTEL_SERVICE_NAME``,
        ``OTEL_RESOURCE_ATTRIBUTES``; service name ``service_name`` unless they give one),
        batch processor (``OTEL_BSP_*``) and exporters as the variables say."""
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": service_name}))
        # Not the global provider: FastAPI >= 0.165 traces by itself once one is set, and the
        # instrumentation below would then trace every request twice.
        provider = TracerProvider(resource=resource)
        processors = [BatchSpanProcessor(exporter) for exporter in _exporters()]
        for processor in processors:
            provider.add_span_processor(processor)
        return cls(provider, processors)

    # -- before the send ----------------------------------------------------------------

    def stamp(self, tasks: Sequence[Task]) -> None:
        """Decide the trace of a batch about to be prepared: its ids, whether it is sampled, and
        each task's ``traceparent`` (its own slot span for the first ``SLOT_SPANS``, else the
        batch span)."""
        trace_id = getrandbits(128)
        while not trace_id & _MASK64 or not trace_id >> 64:
            trace_id = getrandbits(128)
        batch_id = trace_id & _MASK64
        sampled = self._sampler.should_sample(None, trace_id, SEND, SpanKind.PRODUCER)
        flags = "01" if sampled.decision.is_sampled() else "00"
        head = f"00-{trace_id:032x}-"
        own = min(len(tasks), SLOT_SPANS)
        for task in tasks[:own]:
            task.traceparent = f"{head}{_span_id(batch_id):016x}-{flags}"
        shared = f"{head}{batch_id:016x}-{flags}"
        for task in tasks[own:]:
            task.traceparent = shared

    def enter(self, tasks: Sequence[Task]) -> None:
        """Make the batch span of ``tasks`` current for the rest of the calling asyncio task
        (each sub-batch is sent, and each retry runs, in a task of its own): the log lines of
        its send and outcomes carry its trace id (``PM_LOG_FORMAT=json``)."""
        tp = tasks[0].traceparent if tasks else None
        if tp is None:
            return
        trace_id = int(tp[3:35], 16)
        flags = _SAMPLED if tp.endswith("01") else TraceFlags(0)
        batch = NonRecordingSpan(SpanContext(trace_id, trace_id & _MASK64, False, flags))
        otel_context.attach(set_span_in_context(batch))  # the task's own context: dies with it

    def wrap(self, target: StagedTarget, clock: Clock) -> StagedTarget:
        """``target`` with its batches traced (the scheduler's, when tracing is on)."""
        return TracedTarget(target, self, clock)

    # -- after the send -----------------------------------------------------------------

    def sent(
        self,
        target: str,
        tasks: Sequence[Task],
        started: datetime,
        ended: datetime,
        results: Sequence[EnqueueResult] | None,
        error: BaseException | None = None,
    ) -> None:
        """Record one call of the target: the batch's send span (its first call) or a retry
        span, and the slot spans of the outcomes it settled. ``results`` None: it raised
        ``error``."""
        if not tasks or not self._processors:
            return
        tp = tasks[0].traceparent
        if tp is None or not tp.endswith("01"):
            return  # not traced, or not sampled
        trace_id = int(tp[3:35], 16)
        retry = trace_id in self._sent
        if not retry:
            self._sent[trace_id] = None
            if len(self._sent) > _SENT_KEPT:
                self._sent.popitem(last=False)
        counts: Counter[str] = Counter()
        if results is not None:
            counts.update(r.status for r in results)
        settled = 0
        if results is not None:
            settled = self._slot_spans(target, results, ended, retry)
        self._batch_span(target, tasks, trace_id, started, ended, counts, error, retry, settled)
        slot = tasks[0].scheduled_at.isoformat()
        log.debug(
            "traced %d task(s) due %s",
            len(tasks),
            slot,
            extra={"slot": slot, "trace_id": f"{trace_id:032x}"},
        )

    def _batch_span(
        self,
        target: str,
        tasks: Sequence[Task],
        trace_id: int,
        started: datetime,
        ended: datetime,
        counts: Counter[str],
        error: BaseException | None,
        retry: bool,
        slot_spans: int,
    ) -> None:
        first = tasks[0]
        batch_id = trace_id & _MASK64
        attributes: dict[str, Any] = {
            "pm.target": target,
            "pm.slot": slot_text(first.scheduled_at),
            "pm.lateness_s": (started - first.scheduled_at).total_seconds(),
            "messaging.batch.message_count": len(tasks),
            "pm.schedules": [t.name for t in tasks[:NAMES_SHOWN]],
            "pm.queues": list(dict.fromkeys(t.queue for t in tasks))[:NAMES_SHOWN],
            "pm.slot_spans": slot_spans,
        }
        for outcome, n in counts.items():
            attributes[f"pm.outcome.{outcome}"] = n
        events: list[Event] = []
        status = Status(StatusCode.UNSET)
        if error is not None:
            status = Status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
            events.append(
                Event(
                    "exception",
                    {"exception.type": type(error).__name__, "exception.message": str(error)},
                    _ns(ended),
                )
            )
        elif counts.get("failed"):
            status = Status(StatusCode.ERROR, f"{counts['failed']} task(s) failed")
        span_id = _span_id(batch_id) if retry else batch_id
        self._end(
            ReadableSpan(
                RETRY if retry else SEND,
                SpanContext(trace_id, span_id, False, _SAMPLED),
                SpanContext(trace_id, batch_id, False, _SAMPLED) if retry else None,
                self._resource,
                attributes,
                events,
                kind=SpanKind.PRODUCER,
                status=status,
                start_time=_ns(started),
                end_time=_ns(ended),
                instrumentation_scope=self._scope,
            )
        )

    def _slot_spans(
        self, target: str, results: Sequence[EnqueueResult], ended: datetime, retry: bool
    ) -> int:
        """Spans of the settled slots that have one of their own (the first ``SLOT_SPANS`` of
        the batch) and of up to ``SLOT_SPANS`` more that were not enqueued; their number."""
        made = extra = 0
        last: str | None = None
        trace_id = span_id = 0
        for res in results:
            if res.status == "failed" and not res.permanent:
                continue  # to be retried: its span comes with its outcome
            tp = res.task.traceparent
            if tp is None:
                continue
            if tp is not last:  # most tasks of a batch share one string: parsed once
                last, trace_id, span_id = tp, int(tp[3:35], 16), int(tp[36:52], 16)
            batch_id = trace_id & _MASK64
            own = span_id
            if own == batch_id:  # it carries the batch span: a span only if not enqueued
                if res.status == "enqueued" or extra >= SLOT_SPANS:
                    continue
                extra += 1
                own = _span_id(batch_id)
            self._end(self._slot_span(target, res, trace_id, own, ended, retry))
            made += 1
        return made

    def _slot_span(
        self,
        target: str,
        res: EnqueueResult,
        trace_id: int,
        span_id: int,
        ended: datetime,
        retry: bool,
    ) -> ReadableSpan:
        task = res.task
        attributes: dict[str, Any] = {
            "pm.schedule": task.name,
            "pm.slot": slot_text(task.scheduled_at),
            "pm.target": target,
            "messaging.destination.name": task.queue,
            "messaging.message.id": task.id,
            "pm.idempotency_key": task.idempotency_key,
            "pm.status": res.status,
            "pm.retried": retry,
        }
        if res.message_id is not None:
            attributes["pm.message_id"] = res.message_id
        status = Status(StatusCode.UNSET)
        if res.error is not None:
            attributes["pm.error"] = res.error
            if res.status == "failed":
                status = Status(StatusCode.ERROR, res.error)
        return ReadableSpan(
            SLOT,
            SpanContext(trace_id, span_id, False, _SAMPLED),
            SpanContext(trace_id, trace_id & _MASK64, False, _SAMPLED),
            self._resource,
            attributes,
            kind=SpanKind.PRODUCER,
            status=status,
            start_time=_ns(task.scheduled_at),
            end_time=_ns(ended),
            instrumentation_scope=self._scope,
        )

    def _end(self, span: ReadableSpan) -> None:
        for processor in self._processors:
            processor.on_end(span)

    # -- the API and the end -------------------------------------------------------------

    def instrument_app(self, app: Any) -> None:
        """Trace the requests of a FastAPI app through this provider."""
        try:
            from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
        except ImportError as exc:
            raise ConfigError(
                "PM_OTEL", f"tracing the API needs opentelemetry-instrumentation-fastapi: {exc}"
            ) from None
        FastAPIInstrumentor.instrument_app(app, tracer_provider=self.provider)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Export what is queued (at most ``timeout_s`` seconds); False if it did not finish."""
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Export what is queued and stop the exporters."""
        self.provider.shutdown()


# The scheduler's target when tracing is on: every batch it prepares is stamped with its trace
# (the tasks' ``traceparent``) before the target encodes it, and every call that sends is recorded
# as spans once the target answered. Only the scheduler's own sending goes through it; the
# manager keeps the target itself for everything else (its capabilities, health, close).
class TracedTarget:
    """A :class:`~periodic_manager.contracts.StagedTarget` around another one, traced."""

    def __init__(self, target: StagedTarget, tracing: SlotTracing, clock: Clock) -> None:
        self.target = target
        self.tracing = tracing
        self.clock = clock
        self.name = target.name

    def _stamp(self, tasks: Sequence[Task]) -> None:
        # Stamped once: a batch prepared again (a part of it fenced off) keeps its trace.
        if tasks and tasks[0].traceparent is None:
            self.tracing.stamp(tasks)

    def prepare(self, tasks: Sequence[Task]) -> Prepared:
        self._stamp(tasks)
        return self.target.prepare(tasks)

    async def send(self, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
        return await self._traced(self.target.send(prepared, now), prepared.tasks, now)

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        self._stamp(tasks)
        return await self._traced(self.target.enqueue(tasks, now), tasks, now)

    async def _traced(
        self, call: Awaitable[list[EnqueueResult]], tasks: Sequence[Task], now: datetime
    ) -> list[EnqueueResult]:
        self.tracing.enter(tasks)
        try:
            results = await call
        except Exception as exc:
            self.tracing.sent(self.name, tasks, now, self.clock.now(), None, exc)
            raise
        self.tracing.sent(self.name, tasks, now, self.clock.now(), results)
        return results

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        return self.target.completion_off(options)

    async def close(self) -> None:
        await self.target.close()
