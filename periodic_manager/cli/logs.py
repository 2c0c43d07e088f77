"""Log formatting for the CLI (the library itself never configures handlers).

``PM_LOG_FORMAT=json`` writes one JSON object per line with stable keys: ``ts`` (UTC ISO 8601),
``level``, ``logger``, ``message``, every ``extra`` key the code passed (``schedule``, ``slot``,
``idempotency_key``, ...), ``trace_id`` and ``span_id`` when an OpenTelemetry span is current
(``PM_OTEL``: the API's requests, a batch being sent and its outcomes) and ``exc`` with the
traceback when there is one.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys() | {"message", "asctime", "taskName"}
)


class JsonFormatter(logging.Formatter):
    """One JSON object per record; ``extra`` keys are kept (values that are not JSON as text)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            # The record's own creation time: formatting a log line is not "reading the clock".
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in doc:
                doc[key] = value
        if "trace_id" not in doc:
            ids = current_trace()
            if ids is not None:
                doc["trace_id"], doc["span_id"] = ids
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        return json.dumps(doc, default=str, ensure_ascii=False)


def current_trace() -> tuple[str, str] | None:
    """The trace and span id (hex) of the current OpenTelemetry span, if there is a valid one.
    Never imports OpenTelemetry: with tracing off (and nothing else loading it) this is a
    dictionary lookup."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


_HANDLER = "periodic-manager-cli"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: str, fmt: str = "text") -> None:
    """Root handler on stderr, as text or JSON lines."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.set_name(_HANDLER)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER]:
        root.removeHandler(old)  # only ours: configuring twice must not duplicate lines
    root.addHandler(handler)
    root.setLevel(level)
    if level != "DEBUG":
        logging.getLogger("alembic").setLevel(logging.WARNING)  # one line per revision is noise
