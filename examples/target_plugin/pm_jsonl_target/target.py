"""The ``jsonl`` target: each task one JSON object per line of a file, once per slot.

Every send takes an exclusive advisory lock of the file (``fcntl.flock``), reads what other
writers appended since its last look (the idempotency keys already written), appends the lines
of the tasks whose key is not there yet, and flushes them to disk (``fsync``) before it lets the
lock go. So a second send of the same slot, a retry after a lost reply, a restart, or a second
manager on the same host finds the key and reports a duplicate: one line per slot.

What it guarantees: one line per idempotency key among the writers that share the file on one
host and lock it this way; a line torn by a writer that died mid-write is cut off by the next
writer (under the lock), so a line is there whole or not at all. What it does not: writers on
other hosts (``flock`` on a network file system may not exclude them); a file truncated, rotated
or edited by hand (the keys it held are forgotten, so a slot still open could be written again);
completion and failure signals (``options.overlap`` skip/hold and ``pause_after_failures`` are
refused when a schedule is written).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from periodic_manager.contracts import EnqueueResult, Task
from periodic_manager.plugins.task_rules import TaskProblem
from periodic_manager.targets.completion import asks
from pm_jsonl_target import NO_COMPLETION


def task_line(task: Task) -> bytes:
    """The line of ``task``: its key, slot, type and payload (and name, queue, id)."""
    doc = {
        "idempotency_key": task.idempotency_key,
        "scheduled_at": task.scheduled_at.isoformat().replace("+00:00", "Z"),
        "task_type": task.task_type,
        "payload": task.payload,
        "name": task.name,
        "queue": task.queue,
        "id": task.id,
    }
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


class JsonlTarget:
    """Appends tasks to ``path``, once per idempotency key (see the module doc)."""

    name = "jsonl"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._mutex = threading.Lock()  # one send at a time in this process (the cache below)
        self._keys: dict[str, int] = {}  # idempotency key -> its line number
        self._read_to = 0  # bytes of the file read into _keys
        self._inode: int | None = None

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        # A cancelled send may still finish in its thread: the next one then finds its keys.
        return await asyncio.to_thread(self._append, tasks)

    def _append(self, tasks: Sequence[Task]) -> list[EnqueueResult]:
        with self._mutex, open(self.path, "a+b") as file:
            fcntl.flock(file, fcntl.LOCK_EX)  # let go when the file is closed
            self._catch_up(file)
            results, lines = [], []
            for task in tasks:
                line = self._keys.get(task.idempotency_key)
                if line is not None:
                    results.append(EnqueueResult(task, "duplicate", str(line)))
                    continue
                line = len(self._keys) + 1
                self._keys[task.idempotency_key] = line
                lines.append(task_line(task))
                results.append(EnqueueResult(task, "enqueued", str(line)))
            if lines:
                file.write(b"".join(lines))
                file.flush()
                os.fsync(file.fileno())
                self._read_to = file.tell()
            return results

    def _catch_up(self, file: IO[bytes]) -> None:
        """Read the keys other writers appended since the last look (the whole file when it was
        replaced or truncated), cutting off a torn last line."""
        status = os.fstat(file.fileno())
        if status.st_ino != self._inode or status.st_size < self._read_to:
            self._keys, self._read_to, self._inode = {}, 0, status.st_ino
        file.seek(self._read_to)
        data = file.read()
        whole = data[: data.rfind(b"\n") + 1]
        if len(whole) < len(data):  # a writer died mid-line: its slot was never confirmed
            file.truncate(self._read_to + len(whole))
        for line in whole.splitlines():
            self._keys.setdefault(json.loads(line)["idempotency_key"], len(self._keys) + 1)
        self._read_to += len(whole)

    async def ping(self) -> None:
        """Raise unless the file's folder can be written to."""
        if not os.access(self.path.parent, os.W_OK):
            raise PermissionError(f"cannot write to {self.path.parent}")

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        return NO_COMPLETION if asks(options) else None

    async def close(self) -> None:
        return None


def task_problem(
    task_type: str, payload_json: str, options: Mapping[str, Any]
) -> TaskProblem | None:
    """Its write-time rule: the readers of the file expect a payload that is a JSON object."""
    if payload_json.lstrip().startswith("{"):
        return None
    return TaskProblem("payload", "the jsonl target writes payloads that are JSON objects")
