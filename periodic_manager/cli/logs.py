"""Log formatting for the CLI (the library itself never configures handlers).

``PM_LOG_FORMAT=json`` writes one JSON object per line with stable keys: ``ts`` (UTC ISO 8601),
``level``, ``logger``, ``message``, every ``extra`` key the code passed (``schedule``, ``slot``,
``idempotency_key``, ...) and ``exc`` with the traceback when there is one.
"""

from __future__ import annotations

import json
import logging
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
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        return json.dumps(doc, default=str, ensure_ascii=False)


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
