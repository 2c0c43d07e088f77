"""What tracing (PM_OTEL) costs a burst: the same burst with tracing off and on, side by side.

    .venv/bin/python bench/tracing.py [--sizes 10000,100000] [--slots 3] [--rounds 2]

For each N: N rows of ``periodic_jobs`` (PostgreSQL) due at the same instant every period (10 s
up to 20,000, 30 s above), a real manager (database provider and runtime store, Redis Streams
target) on the wall clock, as bench/burst.py runs it; once with tracing off, once with tracing
on, exporting over OTLP/HTTP (protobuf) to a receiver in another process that decodes every
request and counts the spans; ``--rounds`` alternates off and on that many times. Per slot, in
Redis's own clock (stream entry ids), when the first and the last task landed after the slot,
and the manager process's CPU time (every thread: the exporter's too) from 1 s before the slot
until 2 s after it and every task landed (the bench's own reads included, the same in both). Medians over all slots of a mode.

Then the tracer alone: stamping one sub-batch of 10,000 tasks and recording its spans (the
exporter replaced by one that drops them), per task.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.burst import landed, period_of  # noqa: E402
from bench.scale import REDIS, Bench, machine  # noqa: E402
from periodic_manager.contracts import EnqueueResult  # noqa: E402
from periodic_manager.schedules.definition import PeriodicTaskConfig  # noqa: E402
from periodic_manager.targets.base import task_for  # noqa: E402
from periodic_manager.targets.redis.streams import RedisStreamsTarget  # noqa: E402


def _receive(port: Any, spans: Any, ready: Any) -> None:
    """The OTLP/HTTP receiver's process: decodes each request, counts its spans."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            with spans.get_lock():
                spans.value += n
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port.value = server.server_address[1]
    ready.set()
    server.serve_forever()


async def one_run(n: int, slots: int, traced: bool) -> dict[str, Any]:
    period = period_of(n)
    tracing = None
    if traced:
        from periodic_manager.tracing import start_tracing

        tracing = start_tracing("bench")
    async with Bench() as b:
        await b.insert(n, f"@every {period}s")
        target = RedisStreamsTarget.from_url(REDIS, prefix=b.prefix)
        client = aioredis.from_url(REDIS)
        stream = target.stream_key("default")
        mgr = b.manager(target, grace=60, tracing=tracing)
        firsts, lasts, cpus = [], [], []
        await mgr.start()
        try:
            slot_s = (int(time.time()) // period + 2) * period
            for _ in range(slots):
                while time.time() < slot_s - 1:  # noqa: ASYNC110 - a bench waits on the wall clock
                    await asyncio.sleep(0.05)
                cpu0 = time.process_time()
                while time.time() < slot_s + 2:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
                ids: list[int] = []
                while len(ids) < n and time.time() < slot_s + period - 2:
                    ids = [
                        i
                        for i in await landed(client, stream, slot_s * 1000)
                        if i < (slot_s + period) * 1000
                    ]
                    await asyncio.sleep(0.2)  # the spans of the last sub-batch are made
                cpus.append(time.process_time() - cpu0)
                assert len(ids) == n, f"{len(ids)} of {n} tasks in the stream for slot {slot_s}"
                firsts.append((min(ids) - slot_s * 1000) / 1000)
                lasts.append((max(ids) - slot_s * 1000) / 1000)
                if traced:
                    entry = await client.xrange(stream, count=1)
                    assert b"traceparent" in entry[0][1], "a traced burst's entries carry it"
                slot_s += period
            bursts = await client.xlen(stream) // n  # the slot before the first measured too
        finally:
            await mgr.stop()
            await target.close()
            await client.aclose()
            if tracing is not None:
                tracing.shutdown()
        return {"first": firsts, "last": lasts, "cpu": cpus, "bursts": bursts}


def tracer_alone(n: int = 10_000, rounds: int = 5) -> tuple[float, float, int]:
    """Microseconds per task to stamp a sub-batch of ``n`` and to record its spans; spans made."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    from periodic_manager.tracing.otel import SlotTracing

    class Dropping(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracing = SlotTracing(TracerProvider(), [SimpleSpanProcessor(Dropping())])
    slot = datetime(2026, 1, 1, tzinfo=UTC)
    stamp_s, record_s = [], []
    for r in range(rounds):
        tasks = [
            task_for(
                PeriodicTaskConfig.create(name=f"s{r}.{i}", spec="@every 10s", task_type="t"),
                f"s{r}.{i}:2026-01-01T00:00:00Z",
                slot,
                slot + timedelta(seconds=30),
            )
            for i in range(n)
        ]
        t0 = time.perf_counter()
        tracing.stamp(tasks)
        t1 = time.perf_counter()
        results = [EnqueueResult(t, "enqueued", f"{i}-0") for i, t in enumerate(tasks)]
        t2 = time.perf_counter()
        tracing.sent("redis", tasks, slot, slot + timedelta(seconds=0.1), results)
        t3 = time.perf_counter()
        stamp_s.append(t1 - t0)
        record_s.append(t3 - t2)
    made = 1 + min(n, 100)
    return statistics.median(stamp_s) / n * 1e6, statistics.median(record_s) / n * 1e6, made


async def carrying(n: int = 10_000, rounds: int = 5) -> tuple[list[float], list[float]]:
    """Seconds Redis takes to claim and add ``n`` prepared tasks without and with a traceparent
    (the send alone, first call to last entry id), alternating, ``rounds`` times each."""
    target = RedisStreamsTarget.from_url(REDIS, prefix=f"pmbench-tp{os.getpid()}", timeout=60)
    client = aioredis.from_url(REDIS)
    took: dict[bool, list[float]] = {False: [], True: []}
    try:
        for r in range(rounds):
            for traced in (False, True):
                slot = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
                cfg = PeriodicTaskConfig.create(name="c", spec="@every 10s", task_type="bench.task")
                tasks = [
                    task_for(cfg, f"c{r}.{traced}.{i}:x", slot, slot + timedelta(seconds=30))
                    for i in range(n)
                ]
                if traced:
                    from opentelemetry.sdk.trace import TracerProvider

                    from periodic_manager.tracing.otel import SlotTracing

                    SlotTracing(TracerProvider(), []).stamp(tasks)
                prepared = target.prepare(tasks)
                await target.send(target.prepare(tasks[:1]), datetime.now(UTC))  # warm
                start_ms = int(time.time() * 1000)
                await target.send(prepared, datetime.now(UTC))
                ids = await landed(client, target.stream_key("default"), start_ms)
                took[traced].append((max(ids) - start_ms) / 1000)
                await client.delete(target.stream_key("default"))
    finally:
        keys = [k async for k in client.scan_iter(match=f"*pmbench-tp{os.getpid()}*")]
        for i in range(0, len(keys), 1000):
            await client.delete(*keys[i : i + 1000])
        await target.close()
        await client.aclose()
    return took[False], took[True]


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} ms"


async def main(sizes: list[int], slots: int, rounds: int) -> None:
    port = multiprocessing.Value("i", 0)
    spans = multiprocessing.Value("l", 0)
    ready = multiprocessing.Event()
    receiver = multiprocessing.Process(target=_receive, args=(port, spans, ready), daemon=True)
    receiver.start()
    if not await asyncio.to_thread(ready.wait, 30):
        raise RuntimeError("the OTLP receiver did not start")
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"http://127.0.0.1:{port.value}/v1/traces"
    os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
    print(f"machine: {machine()}\nrun at {datetime.now(UTC).isoformat(timespec='seconds')}\n")
    print(
        "| N | tracing | slots | first task after slot | last task after slot (each) "
        "| CPU of the manager per burst (each) | spans exported per burst |"
    )
    print("|---|---|---|---|---|---|---|")
    try:
        for n in sizes:
            got: dict[bool, dict[str, list[float]]] = {
                False: {"first": [], "last": [], "cpu": []},
                True: {"first": [], "last": [], "cpu": []},
            }
            exported = bursts = 0
            for _ in range(rounds):
                for traced in (False, True):
                    before = spans.value
                    r = await one_run(n, slots, traced)
                    if traced:
                        exported += spans.value - before
                        bursts += r.pop("bursts")
                    r.pop("bursts", None)
                    for key in got[traced]:
                        got[traced][key] += r[key]
            for traced in (False, True):
                g = got[traced]
                each = ", ".join(f"{x * 1000:.0f}" for x in g["last"])
                cpu = ", ".join(f"{x * 1000:.0f}" for x in g["cpu"])
                per_burst = f"{exported / max(1, bursts):,.0f}" if traced else "-"
                print(
                    f"| {n:,} | {'on' if traced else 'off'} | {len(g['last'])} | {ms(g['first'])}"
                    f" | {ms(g['last'])} ({each}) | {ms(g['cpu'])} ({cpu}) | {per_burst} |",
                    flush=True,
                )
    finally:
        receiver.terminate()
    plain, traced_tasks = await carrying()
    print(
        f"\nCarrying the traceparent (a stream field more), Redis's own time for 10,000 prepared "
        f"tasks: without {ms(plain)} ({', '.join(f'{x * 1000:.0f}' for x in plain)}), with "
        f"{ms(traced_tasks)} ({', '.join(f'{x * 1000:.0f}' for x in traced_tasks)})."
    )
    stamp_us, record_us, made = tracer_alone()
    print(
        f"\nThe tracer alone, one sub-batch of 10,000 tasks: stamping {stamp_us:.2f} us a task "
        f"(before the instant), recording its spans {record_us:.2f} us a task after the target "
        f"answered ({made} spans made a sub-batch)."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(main([int(x) for x in args.sizes.split(",") if x], args.slots, args.rounds))
