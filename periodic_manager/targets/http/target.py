"""The http target: a slot is sent by inserting its delivery row, once per idempotency key; the
deliverer of any manager makes the request (``deliverer.py``), which this target runs beside
the manager (:meth:`HttpTarget.run_beside`).

The body is ``{"schedule", "scheduled_at", "task_type", "payload"}`` (the payload's JSON text as
it is); the request, resolved from the schedule's options when the slot is sent, is stored with
it, so a retry, a takeover and a replay send what the slot was.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.contracts import (
    FINISHED,
    NONE,
    UNFINISHED,
    Clock,
    EnqueueResult,
    Prepared,
    Previous,
    Task,
)
from periodic_manager.db.http_deliveries import DEAD, DONE, PENDING, DeliveryStore
from periodic_manager.errors import TargetError
from periodic_manager.schedules.failures import FAILED, SUCCEEDED, UNKNOWN
from periodic_manager.schedules.failures import PENDING as OUTCOME_PENDING
from periodic_manager.schedules.instants import slot_text
from periodic_manager.schedules.rules import canonical_json
from periodic_manager.targets.base import overlap_of, overlap_timeout_ms
from periodic_manager.targets.database import batch_results
from periodic_manager.targets.http.config import HttpConfig
from periodic_manager.targets.http.options import request_of
from periodic_manager.tracing import trace_headers

HTTP_NO_COMPLETION = (
    "the http target does not hold a schedule's slot while its previous delivery is pending "
    "(not built yet)"
)


def body_of(task: Task) -> str:
    """The request body of ``task`` (JSON text; the payload's text as it is)."""
    return (
        '{"schedule":' + json.dumps(task.name)
        + ',"scheduled_at":' + json.dumps(slot_text(task.scheduled_at))
        + ',"task_type":' + json.dumps(task.task_type)
        + ',"payload":' + task.payload_text() + "}"
    )  # fmt: skip


def host_of(url: str) -> str:
    """The host:port a URL reaches (the key of the pacing per host)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{(parts.hostname or '').lower()}:{port}"[:300]


class HttpTarget:
    """Sends each slot as one durable delivery (see the module doc)."""

    name = "http"

    def __init__(self, engine: AsyncEngine, config: HttpConfig | None = None) -> None:
        self._engine = engine
        self.config = config or HttpConfig()
        self.store = DeliveryStore(engine)
        self.wake = asyncio.Event()  # set when rows were inserted: the deliverer looks at once
        self.counts: Counter[str] = Counter()  # outcomes of this manager's deliveries

    def prepare(self, tasks: Sequence[Task]) -> Prepared:
        """Resolve each task's request; a task whose options cannot make one is refused alone."""
        rows: dict[int, dict[str, Any]] = {}
        refusals: dict[int, str] = {}
        for index, task in enumerate(tasks):
            try:
                request = request_of(
                    task.options, self.config.url, private_ok=self.config.allow_private
                )
                request["headers"].update(trace_headers(task))  # every attempt carries it
                body = body_of(task)
            except (TypeError, ValueError) as exc:
                refusals[index] = f"http: {exc}"
                continue
            rows[index] = {
                "idempotency_key": task.idempotency_key,
                "name": task.name,
                "slot_at": task.scheduled_at,
                "host": host_of(request["url"]),
                "request": canonical_json(request),
                "body": body,
                "state": PENDING,
                "attempts": 0,
            }
        return Prepared(list(tasks), (rows, refusals))

    async def send(self, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
        rows, refusals = prepared.data
        tasks = prepared.tasks
        stamped = {i: {**r, "created_at": now, "next_attempt_at": now} for i, r in rows.items()}
        held = {i for i in stamped if overlap_of(tasks[i]) != "allow"}
        plain = [r for i, r in stamped.items() if i not in held]
        decided: dict[int, EnqueueResult] = {}
        try:
            ids = await self.store.insert(plain) if plain else {}
            for i in sorted(held, key=lambda i: tasks[i].name):  # the locks' one order
                decided[i] = await self._send_held(tasks[i], stamped[i])
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            raise TargetError(f"http: {type(exc).__name__}: {exc}") from exc
        if any(r.status == "enqueued" for r in decided.values()):
            self.wake.set()
        if any(new for _, new in ids.values()):
            self.wake.set()
        inserted = {key: row for key, (row, fresh) in ids.items() if fresh}
        existing = {key: row for key, (row, fresh) in ids.items() if not fresh}
        return batch_results(tasks, refusals, decided, inserted, existing)

    async def _send_held(self, task: Task, row: dict[str, Any]) -> EnqueueResult:
        """A task of a schedule with ``options.overlap`` skip or hold: sent only once its
        previous delivery is done or dead (or older than ``options.overlap_timeout``)."""
        timeout_ms = overlap_timeout_ms(task)
        timeout = timedelta(milliseconds=timeout_ms) if timeout_ms else None
        row_id, fresh, seen = await self.store.insert_after(row, timeout)
        previous = Previous(None, NONE)
        if seen is not None:
            state = FINISHED if seen[1] in (DONE, DEAD) else UNFINISHED
            previous = Previous(str(seen[0]), state, timed_out=seen[2])
        if row_id is None:
            return EnqueueResult(task, "busy", previous=previous)
        return EnqueueResult(
            task, "enqueued" if fresh else "duplicate", str(row_id), previous=previous
        )

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        return await self.send(self.prepare(tasks), now)

    async def run_beside(self, clock: Clock, owner: str) -> None:
        """The deliverer of this manager, until cancelled (the manager supervises it)."""
        from periodic_manager.targets.http.deliverer import Deliverer

        await Deliverer(self.store, self.config, clock, owner, self.wake, self.counts).run()

    def delivery_counts(self) -> dict[str, int]:
        """This manager's deliveries by outcome: done, retried, dead (the metrics)."""
        return {outcome: self.counts[outcome] for outcome in ("done", "retried", "dead")}

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        """A delivery has finished once the receiver answered 2xx, or it is a dead letter."""
        return None

    def failure_off(self, options: Mapping[str, Any]) -> str | None:
        """A delivery that ended dead is a failed task; one done, a succeeded one."""
        return None

    async def outcomes(self, options: Mapping[str, Any], task_ids: Sequence[str]) -> list[str]:
        ids = {t: int(t) for t in task_ids if t.isdigit()}
        try:
            states = await self.store.states(set(ids.values()))
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            raise TargetError(f"http: {type(exc).__name__}: {exc}") from exc
        by_state = {DONE: SUCCEEDED, DEAD: FAILED, PENDING: OUTCOME_PENDING}
        return [by_state.get(states.get(ids.get(t, -1), ""), UNKNOWN) for t in task_ids]

    @property
    def in_manager_database(self) -> bool:
        return True

    async def ping(self) -> None:
        """Raise unless the database the deliveries live in answers."""
        async with self._engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def close(self) -> None:
        """Nothing to release: the engine is the manager's, the deliverer's client its own."""
