"""PM_OTEL: the spans of a burst reach an OTLP/HTTP receiver with the right parents and
attributes, every stream entry carries a traceparent naming an exported span, the sampler is
honoured, and with tracing off nothing of OpenTelemetry is even imported."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from api.app import create_app
from periodic_manager.cli.logs import JsonFormatter
from periodic_manager.clock import VirtualClock
from periodic_manager.db.engine import create_engine
from periodic_manager.errors import ConfigError
from periodic_manager.providers import StaticProvider
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.runtime.timing import Timing
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.settings import Settings
from periodic_manager.targets.redis.streams import RedisStreamsTarget
from periodic_manager.targets.rq import RqTarget
from periodic_manager.tracing import start_tracing
from periodic_manager.tracing.otel import RETRY, SEND, SLOT, SLOT_SPANS, SlotTracing
from tests.support.celery_arq_rig import rq_burst
from tests.support.otlp import Receiver, otlp_receiver

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
SLOT_AT = "2024-05-01T12:00:10Z"
BURST = SLOT_SPANS + 150  # some slots with a span of their own, the others carry the batch's
PRODUCER = 4  # SpanKind in OTLP: SPAN_KIND_PRODUCER
ERROR = 2  # Status.code: STATUS_CODE_ERROR


def rows(n: int, queue: str = "default") -> list[PeriodicTaskConfig]:
    return [
        PeriodicTaskConfig.create(
            name=f"job-{i:04d}",
            spec="@every 10s",
            task_type="demo",
            schedule_id=i + 1,
            options={"queue": queue},
        )
        for i in range(n)
    ]


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    with otlp_receiver() as rec:
        for name in ("OTEL_TRACES_SAMPLER", "OTEL_SERVICE_NAME", "OTEL_TRACES_EXPORTER"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", rec.url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
        yield rec


@pytest.fixture
async def tracing(receiver: Receiver) -> AsyncIterator[SlotTracing]:
    t = start_tracing("pm-test")
    yield t
    t.shutdown()


async def run_burst(
    client: aioredis.Redis, prefix: str, tracing: SlotTracing, n: int = BURST, **kw: Any
) -> PeriodicTaskManager:
    """A manager sending ``n`` schedules due at T0 + 10 s to Redis Streams, traced."""
    clock = VirtualClock(T0)
    mgr = PeriodicTaskManager(
        StaticProvider(rows(n)),
        kw.pop("target", None) or RedisStreamsTarget(client, prefix=prefix, group="workers"),
        clock=clock,
        timing=Timing(grace=30, sync_interval=3600),
        tracing=tracing,
        **kw,
    )
    await mgr.start()
    try:
        for step in (10, 2):  # the slot, then time for a retry's backoff
            await clock.advance(step, settle=lambda: mgr.wait_settled(clock.now()))
    finally:
        await mgr.stop()  # flushes the spans
    return mgr


async def entries(client: aioredis.Redis, prefix: str) -> list[dict[str, str]]:
    return [fields for _, fields in await client.xrange(f"{{{prefix}:default}}:stream")]


def parse(traceparent: str) -> tuple[str, str, str]:
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00" and len(trace_id) == 32 and len(span_id) == 16
    return trace_id, span_id, flags


async def test_a_burst_exports_its_batch_and_slot_spans_and_every_entry_names_one(
    redis_client: aioredis.Redis, redis_prefix: str, receiver: Receiver, tracing: SlotTracing
) -> None:
    await run_burst(redis_client, redis_prefix, tracing)
    assert not receiver.errors

    (send,) = receiver.named(SEND)  # one sub-batch: one trace, rooted at its send span
    assert send.parent_id == "" and send.kind == PRODUCER
    assert send.resource["service.name"] == "pm-test"
    assert send.resource["deployment.environment"] == "test"
    assert send.attributes["pm.target"] == "redis"
    assert send.attributes["pm.slot"] == SLOT_AT
    assert send.attributes["messaging.batch.message_count"] == BURST
    assert send.attributes["pm.outcome.enqueued"] == BURST
    assert send.attributes["pm.queues"] == ["default"]
    assert send.attributes["pm.schedules"][:2] == ["job-0000", "job-0001"]
    assert send.attributes["pm.slot_spans"] == SLOT_SPANS
    assert send.status_code != ERROR

    slots = receiver.named(SLOT)
    assert len(slots) == SLOT_SPANS
    for span in slots:
        assert (span.trace_id, span.parent_id, span.kind) == (send.trace_id, send.span_id, PRODUCER)
        assert span.attributes["pm.slot"] == SLOT_AT
        assert span.attributes["pm.target"] == "redis"
        assert span.attributes["messaging.destination.name"] == "default"
        assert span.attributes["pm.status"] == "enqueued"
        assert span.attributes["pm.idempotency_key"] == (
            f"{span.attributes['pm.schedule']}:{SLOT_AT}"
        )
        # From the slot's instant to its outcome: its duration is how late it went out.
        assert span.start_ns == int((T0 + timedelta(seconds=10)).timestamp()) * 10**9
        assert span.end_ns >= span.start_ns

    exported = {s.span_id: s for s in receiver.spans if s.trace_id == send.trace_id}
    messages = await entries(redis_client, redis_prefix)
    assert len(messages) == BURST
    own = 0
    for fields in messages:
        trace_id, span_id, flags = parse(fields["traceparent"])
        assert (trace_id, flags) == (send.trace_id, "01")
        parent = exported[span_id]  # every entry names a span that was exported
        if parent.name == SLOT:
            own += 1
            assert parent.attributes["pm.schedule"] == fields["name"]
            assert parent.attributes["messaging.message.id"] == fields["id"]
        else:
            assert parent is send
    assert own == SLOT_SPANS


async def test_the_sampler_decides_per_batch_and_an_unsampled_one_exports_nothing(
    redis_client: aioredis.Redis,
    redis_prefix: str,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    tracing = start_tracing()
    try:
        await run_burst(redis_client, redis_prefix, tracing, n=20)
    finally:
        tracing.shutdown()
    messages = await entries(redis_client, redis_prefix)
    assert len(messages) == 20
    assert {parse(m["traceparent"])[2] for m in messages} == {"00"}  # carried, not sampled
    assert receiver.spans == []


class FlakyStreams(RedisStreamsTarget):
    """Redis Streams whose first call raises (the connection lost), then works."""

    calls = 0

    async def send(self, prepared: Any, now: datetime) -> Any:
        self.calls += 1
        if self.calls == 1:
            from periodic_manager.errors import TargetError

            raise TargetError("redis: connection lost (test)")
        return await super().send(prepared, now)


async def test_a_retry_is_a_child_of_the_send_and_the_slots_say_they_were_retried(
    redis_client: aioredis.Redis, redis_prefix: str, receiver: Receiver, tracing: SlotTracing
) -> None:
    target = FlakyStreams(redis_client, prefix=redis_prefix, group="workers")
    await run_burst(redis_client, redis_prefix, tracing, n=5, target=target)
    (send,) = receiver.named(SEND)
    assert send.status_code == ERROR and "exception" in send.events
    retries = receiver.named(RETRY)
    assert retries and all(
        (r.trace_id, r.parent_id) == (send.trace_id, send.span_id) for r in retries
    )
    assert retries[-1].attributes["pm.outcome.enqueued"] == 5
    slots = receiver.named(SLOT)
    assert len(slots) == 5
    assert all(s.attributes["pm.retried"] is True for s in slots)
    assert all(s.parent_id == send.span_id for s in slots)
    messages = await entries(redis_client, redis_prefix)
    assert {parse(m["traceparent"])[1] for m in messages} == {s.span_id for s in slots}


def test_with_tracing_off_opentelemetry_is_not_imported(tmp_path: Any) -> None:
    """A manager that sends a slot, and everything the CLI's manager imports, without PM_OTEL:
    not one module of OpenTelemetry is loaded, and tasks carry no traceparent."""
    script = textwrap.dedent(
        """
        import asyncio, json, sys
        from datetime import UTC, datetime
        import periodic_manager.cli.main, periodic_manager.runtime.assemble
        from periodic_manager.clock import VirtualClock
        from periodic_manager.providers import StaticProvider
        from periodic_manager.runtime.manager import PeriodicTaskManager
        from periodic_manager.schedules.definition import PeriodicTaskConfig
        from periodic_manager.settings import Settings
        from periodic_manager.targets.memory import MemoryTarget

        assert Settings().otel is False

        async def main():
            clock = VirtualClock(datetime(2024, 5, 1, tzinfo=UTC))
            target = MemoryTarget()
            row = PeriodicTaskConfig.create(name="a", spec="@every 10s", task_type="t")
            mgr = PeriodicTaskManager(StaticProvider([row]), target, clock=clock)
            await mgr.start()
            await clock.advance(10, settle=lambda: mgr.wait_settled(clock.now()))
            await mgr.stop()
            return [t.traceparent for t, _ in target.messages]

        sent = asyncio.run(main())
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
        print(json.dumps({"sent": sent, "loaded": loaded}))
        """
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("PM_", "OTEL_"))}
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"sent": [None], "loaded": []}


async def test_a_real_rq_worker_continues_the_trace_from_the_jobs_traceparent(
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
    receiver: Receiver,
    tracing: SlotTracing,
    tmp_path: Path,
) -> None:
    """schedule -> enqueue -> run as one trace: the worker's span is a child of the span the
    job's traceparent names, in the manager's trace."""
    queue = f"{redis_prefix}-q"
    target = RqTarget.from_url(redis_url, prefix=redis_prefix, key_prefix=redis_prefix)
    configs = [
        PeriodicTaskConfig.create(
            name=f"rq-{i}",
            spec="@every 10s",
            task_type="tests.support.traced_rq_app.run",
            schedule_id=i + 1,
            options={"queue": queue},
        )
        for i in range(3)
    ]
    clock = VirtualClock(T0)
    mgr = PeriodicTaskManager(
        StaticProvider(configs),
        target,
        clock=clock,
        timing=Timing(grace=30, sync_interval=3600),
        tracing=tracing,
        close_target=True,
    )
    await mgr.start()
    try:
        await clock.advance(10, settle=lambda: mgr.wait_settled(clock.now()))
    finally:
        await mgr.stop()
    (send,) = receiver.named(SEND)
    manager_spans = {s.span_id: s for s in receiver.spans}

    rq_burst(redis_prefix, queue, redis_url, tmp_path / "rq.log")

    runs = receiver.named("worker.run")
    assert len(runs) == 3
    for run in runs:
        assert run.resource["service.name"] == "rq-worker"
        assert run.trace_id == send.trace_id
        parent = manager_spans[run.parent_id]  # the slot span the job's traceparent named
        assert parent.name == SLOT and parent.parent_id == send.span_id
        assert parent.attributes["messaging.message.id"] == run.attributes["rq.job.id"]


class JsonLines(logging.Handler):
    """Formats each record as the CLI's JSON lines do, when it is emitted (in its context)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


async def test_json_log_lines_of_a_traced_batch_carry_its_slot_and_trace_id(
    redis_client: aioredis.Redis, redis_prefix: str, receiver: Receiver, tracing: SlotTracing
) -> None:
    handler = JsonLines()
    logger = logging.getLogger("periodic_manager")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        target = FlakyStreams(redis_client, prefix=redis_prefix, group="workers")
        await run_burst(redis_client, redis_prefix, tracing, n=3, target=target)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    (send,) = receiver.named(SEND)
    failed = [line for line in handler.lines if line["message"].startswith("enqueue failed")]
    assert failed, handler.lines
    assert failed[0]["slot"] == (T0 + timedelta(seconds=10)).isoformat()  # as log lines say it
    assert (failed[0]["trace_id"], failed[0]["span_id"]) == (send.trace_id, send.span_id)
    traced = [line for line in handler.lines if line["message"].startswith("traced 3 task")]
    assert traced and traced[0]["trace_id"] == send.trace_id and "slot" in traced[0]
    started = [line for line in handler.lines if " started" in line["message"]]
    assert started and all("trace_id" not in line for line in started)  # no span current


async def test_the_api_traces_its_requests_and_continues_a_callers_trace(
    migrated_sqlite_url: str, receiver: Receiver, tracing: SlotTracing
) -> None:
    engine = create_engine(migrated_sqlite_url)
    app = create_app(
        Settings(database_url=migrated_sqlite_url, otel=True),
        clock=VirtualClock(T0),
        engine=engine,
        tracing=tracing,
    )
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
                assert (await c.get("/schedules")).status_code == 200
                r = await c.get("/schedules", headers={"traceparent": caller})
                assert r.status_code == 200
                assert (await c.post("/schedules", json={"name": ""})).status_code == 422
    finally:
        await engine.dispose()
    assert tracing.flush()
    server = [s for s in receiver.spans if s.kind == 2]  # SPAN_KIND_SERVER
    assert len(server) == 3, [(s.name, s.kind) for s in receiver.spans]
    assert {s.attributes.get("http.route") for s in server} == {"/schedules"}
    assert all(s.resource["service.name"] == "pm-test" for s in server)
    continued = [s for s in server if s.trace_id == "0af7651916cd43dd8448eb211c80319c"]
    assert len(continued) == 1 and continued[0].parent_id == "b7ad6b7169203331"
    codes = sorted(
        s.attributes.get("http.response.status_code", s.attributes.get("http.status_code"))
        for s in server
    )
    assert codes == [200, 200, 422]


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "use http/protobuf or grpc"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "carrier-pigeon", "use http/protobuf or grpc"),
        ("OTEL_TRACES_EXPORTER", "zipkin", "use otlp, console or none"),
    ],
)
def test_a_variable_the_tracer_cannot_use_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, said: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        start_tracing()
    assert caught.value.field == variable and said in caught.value.reason


def test_tracing_without_the_extra_names_it(tmp_path: Path) -> None:
    """PM_OTEL=true where the SDK is not installed: the manager refuses to start, in one line
    naming the setting and the extra."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry.sdk"] = None  # as if the otel extra were not installed
        from periodic_manager.errors import ConfigError
        from periodic_manager.tracing import start_tracing
        try:
            start_tracing()
        except ConfigError as exc:
            print(exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.startswith("PM_OTEL: tracing needs the otel extra")
    assert "pip install 'periodic-manager[otel]'" in out.stdout
