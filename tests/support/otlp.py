"""An OTLP/HTTP receiver for the tests: ``POST /v1/traces`` with an ExportTraceServiceRequest
(protobuf, gzip or not) on 127.0.0.1, its spans kept as plain values."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind is not None else None


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str  # "" for a root span
    kind: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    start_ns: int
    end_ns: int
    status_code: int
    events: list[str] = field(default_factory=list)


class Receiver:
    """The spans received so far (every request decoded; a malformed one is a test failure)."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self.url = ""

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        out = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append(
                        ReceivedSpan(
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.kind,
                            {a.key: _value(a.value) for a in s.attributes},
                            resource,
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                            s.status.code,
                            [e.name for e in s.events],
                        )
                    )
        with self._lock:
            self.spans.extend(out)

    def named(self, name: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.name == name]


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            try:
                if self.path != "/v1/traces":
                    raise ValueError(f"unexpected path {self.path}")
                if self.headers.get("Content-Type") != "application/x-protobuf":
                    raise ValueError(f"unexpected type {self.headers.get('Content-Type')}")
                receiver.add(body)
            except Exception as exc:  # noqa: BLE001 - kept for the test to assert on
                receiver.errors.append(str(exc))
                self.send_response(400)
                self.end_headers()
                return
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    return Handler


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A receiver listening on a free loopback port (``receiver.url``: its /v1/traces)."""
    receiver = Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
