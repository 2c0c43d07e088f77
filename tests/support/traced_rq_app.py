"""A function for a real RQ worker that continues the manager's trace: it reads the job's
``meta["traceparent"]`` and records a ``worker.run`` span under it, exported over OTLP/HTTP as
the ``OTEL_EXPORTER_OTLP_*`` variables of the worker say (the test's receiver)."""

from __future__ import annotations

from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from rq import get_current_job


def run(*args: Any, **kwargs: Any) -> None:
    job = get_current_job()
    assert job is not None
    carrier = {"traceparent": job.meta["traceparent"]}
    provider = TracerProvider(resource=Resource.create({"service.name": "rq-worker"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    parent = TraceContextTextMapPropagator().extract(carrier)
    tracer = provider.get_tracer("tests.traced_rq_app")
    with tracer.start_as_current_span(
        "worker.run", context=parent, kind=SpanKind.CONSUMER, attributes={"rq.job.id": job.id}
    ):
        pass
    provider.shutdown()  # the work horse exits after the job: export now
