"""Sending one instant's slots: tasks, sub-batches, retries within grace, outcomes.

A batch goes out as sub-batches of ``SEND_CHUNK`` tasks, a few in flight at once so the target
works on one while the next is handed over. A failed call is retried whole with capped
exponential backoff while its slots may still be sent (until their expiry: grace, or the
catch-up window); tasks a target failed one by one are retried alone. Every outcome becomes a
run (enqueued, duplicate, failed) for the history and the metrics, and the hooks see each
sub-batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from periodic_manager.clock import later
from periodic_manager.contracts import (
    Clock,
    EnqueueResult,
    Prepared,
    RunRecord,
    StagedTarget,
    Task,
    run_status,
)
from periodic_manager.engine.history import RunWriter
from periodic_manager.schedules.definition import PeriodicTaskConfig, slot_text
from periodic_manager.targets.base import send_prepared, task_for

if TYPE_CHECKING:
    from periodic_manager.engine.entry import ScheduledEntry
    from periodic_manager.engine.overlap import OverlapGuard

log = logging.getLogger(__name__)

PreEnqueueHook = Callable[[Sequence[Task]], Awaitable[None] | None]
PostEnqueueHook = Callable[[Sequence[EnqueueResult]], Awaitable[None] | None]
ErrorHook = Callable[[BaseException, Sequence[Task]], Awaitable[None] | None]


@dataclass(frozen=True, slots=True)
class Hooks:
    """Code of your own around every sub-batch sent (sync or async; a hook that raises is logged
    and never stops the schedule): ``pre_enqueue(tasks)`` before, ``post_enqueue(results)``
    after, ``on_error(exc, tasks)`` when its slots could not be sent within grace."""

    pre_enqueue: PreEnqueueHook | None = None
    post_enqueue: PostEnqueueHook | None = None
    on_error: ErrorHook | None = None

SEND_CHUNK = 10000  # slots per sub-batch of a large instant
MAX_IN_FLIGHT = 4  # sub-batches awaiting the target at once

# A sub-batch: the entries and their prepared tasks, in the same order.
Chunk = tuple[list["ScheduledEntry"], Prepared]


async def prepare(
    target: StagedTarget,
    slot: datetime,
    entries: list[ScheduledEntry],
    window: Callable[[PeriodicTaskConfig], timedelta],
) -> list[Chunk]:
    """Tasks of ``entries`` for ``slot``, cut into sub-batches and prepared by the target (other
    tasks run between sub-batches: staging 100,000 tasks must not hold the event loop).
    ``window(config)``: how long after the slot each task may still be sent."""
    text = slot_text(slot)
    chunks: list[Chunk] = []
    for i in range(0, len(entries), SEND_CHUNK):
        if i:
            await asyncio.sleep(0)
        part = entries[i : i + SEND_CHUNK]
        tasks = []
        for entry in part:
            cfg = entry.config
            tasks.append(task_for(cfg, f"{cfg.name}:{text}", slot, later(slot, window(cfg))))
        chunks.append((part, prepare_tasks(target, tasks)))
    return chunks


def prepare_tasks(target: StagedTarget, tasks: list[Task]) -> Prepared:
    try:
        return target.prepare(tasks)
    except Exception as exc:  # noqa: BLE001 - the send path reports it (enqueue re-encodes)
        log.debug("prepare failed, the batch is encoded when sent: %s", exc)
        return Prepared(tasks)


async def _call(hook: Callable[..., Any] | None, *args: Any) -> None:
    if hook is None:
        return
    result = hook(*args)
    if asyncio.iscoroutine(result):
        await result


class Dispatcher:
    """Sends prepared sub-batches to the target and turns the outcomes into runs."""

    def __init__(
        self,
        target: StagedTarget,
        *,
        clock: Clock,
        writer: RunWriter,
        backoff: Callable[[float], Awaitable[None]],
        may_send: Callable[[], bool],
        hooks: Hooks,
        retry_base: float = 0.2,
        retry_max: float = 5.0,
        overlap: OverlapGuard | None = None,
        fence: Callable[[], Callable[[int | str], bool] | None] = lambda: None,
    ) -> None:
        self.target = target
        # The idents not to send for, asked right before every attempt (None: all may be sent):
        # partitions whose lease is no longer trusted are dropped and fenced off then, so a
        # manager whose loop was held past its trust sends nothing for them, whatever ran first.
        self.fence = fence
        self.overlap = overlap  # options.overlap: busy answers, held slots
        self.clock = clock
        self.writer = writer
        self.backoff = backoff
        self.may_send = may_send  # False when stopping or no longer leading: no more retries
        self.hooks = hooks
        self.retry_base = retry_base
        self.retry_max = retry_max
        self.counts: dict[str, int] = {
            "enqueued": 0, "duplicate": 0, "resent": 0, "skipped": 0, "failed": 0, "held": 0,
        }  # fmt: skip
        self.progress_at: datetime | None = None  # last sign of life of a send under way
        self._failing = 0  # consecutive failed attempts (one log line per outage)
        self._inflight = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._sending = 0  # sub-batches under way

    def start(self, slot: datetime, chunks: list[Chunk]) -> list[asyncio.Future[None]]:
        """Start sending every sub-batch (at most ``MAX_IN_FLIGHT`` awaiting the target)."""
        return [asyncio.ensure_future(self._send_chunk(slot, part, prep)) for part, prep in chunks]

    async def _send_chunk(self, slot: datetime, entries: list[ScheduledEntry], prepared: Prepared) -> None:
        self._sending += 1
        try:
            await self._send_chunk_once(slot, entries, prepared)
        finally:
            self._sending -= 1
            if not self._sending:
                self.progress_at = None

    async def _send_chunk_once(
        self, slot: datetime, entries: list[ScheduledEntry], prepared: Prepared
    ) -> None:
        try:
            async with self._inflight:
                fenced = self.fence()
                if fenced is not None and any(fenced(e.ident) for e in entries):
                    kept = [i for i, e in enumerate(entries) if not fenced(e.ident)]
                    if not kept:
                        return
                    entries = [entries[i] for i in kept]
                    prepared = prepare_tasks(self.target, [prepared.tasks[i] for i in kept])
                tasks = prepared.tasks
                await _call(self.hooks.pre_enqueue, tasks)
                results = await self._send(prepared, slot, entries)
        except Exception as exc:  # noqa: BLE001 - any target failure is reported, never fatal
            self._gave_up(slot, entries, tasks, exc)
            await self._safe_hook(self.hooks.on_error, exc, tasks)
            return
        runs: list[RunRecord] = []
        at = self.clock.now()
        counts = self.counts
        overlap = self.overlap
        held = overlap.held if overlap is not None else {}
        for entry, res in zip(entries, results, strict=True):
            status = res.status
            if res.error is not None or entry.next_slot is not None:  # keep "no slot left"
                entry.last_error = res.error  # set when the target failed this task alone
            if status == "failed":
                log.error(
                    "enqueue of %s due %s failed: %s", entry.config.name, slot.isoformat(), res.error,
                    extra={"schedule": entry.config.name, "slot": slot.isoformat()},
                )
            # options.overlap: a target's answer about the previous task, or a held schedule.
            if overlap is not None and (
                res.previous is not None or status == "busy" or (held and entry.ident in held)
            ):
                for run in overlap.outcome(entry, slot, res, at):  # busy: skipped or held
                    counts[run.status] += 1
                    runs.append(run)
                continue
            counts[status] += 1
            runs.append(
                RunRecord(
                    entry.key, entry.name, slot, run_status(status), at, res.message_id, res.error,
                    limited=entry.runs_left is not None,
                )
            )
        log.debug("enqueued %d task(s) due %s", len(tasks), slot.isoformat(), extra={"slot": slot.isoformat()})
        await self._safe_hook(self.hooks.post_enqueue, results)
        self.writer.report(runs)

    def _gave_up(self, slot: datetime, entries: list[ScheduledEntry], tasks: list[Task], exc: Exception) -> None:
        at = self.clock.now()
        for entry in entries:
            entry.last_error = str(exc)
        self.counts["failed"] += len(tasks)
        if self.overlap is not None:
            self.overlap.drop(entries, slot)
        log.error(
            "gave up on %d task(s) due %s: %s", len(tasks), slot.isoformat(), exc,
            extra={"slot": slot.isoformat(), "batch": len(tasks)},
        )
        self.writer.report([RunRecord(e.key, e.config.name, slot, "failed", at, error=str(exc)) for e in entries])

    async def _send(
        self, prepared: Prepared, slot: datetime, entries: list[ScheduledEntry]
    ) -> list[EnqueueResult]:
        """Send, retrying with capped exponential backoff while the batch may still be sent.

        The first attempt sends the prepared batch; a failed call is retried whole, and tasks a
        target reports ``failed`` one by one are retried alone. Gives up once the next attempt
        would fall after the deadline, on shutdown, when leadership is lost or one of ``entries``
        is fenced off (its partition lost): re-raising if
        nothing was sent, else reporting the rest as failed. Logs once per outage.
        """
        tasks = prepared.tasks
        deadline: datetime | None = None  # computed on the first failure (never on a burst's path)
        final: list[EnqueueResult | None] = [None] * len(tasks)
        todo = list(range(len(tasks)))
        attempt = 0
        while True:
            error: Exception | None = None
            self.progress_at = self.clock.now()
            try:
                if attempt == 0 or len(todo) == len(tasks):
                    results = await send_prepared(self.target, prepared, self.clock.now())
                else:
                    results = await self.target.enqueue([tasks[i] for i in todo], self.clock.now())
            except Exception as exc:
                error = exc
                self.progress_at = self.clock.now()
            else:
                self.progress_at = self.clock.now()
                retry = []
                for i, res in zip(todo, results, strict=True):
                    final[i] = res
                    if res.status == "failed":
                        retry.append(i)
                if not retry:
                    if self._failing:
                        log.warning("target recovered after %d failed attempt(s)", self._failing)
                        self._failing = 0
                    return [r for r in final if r is not None]
                todo = retry
            attempt += 1
            self._failing += 1
            if self._failing == 1:
                log.error(
                    "enqueue failed, retrying while slots are within grace: %s",
                    error if error is not None else final[todo[0]].error,  # type: ignore[union-attr]
                    extra={"slot": slot.isoformat(), "batch": len(todo)},
                )
            delay = min(self.retry_max, self.retry_base * 2 ** (attempt - 1))
            if deadline is None:
                deadline = min(t.expires_at for t in tasks)
            stop = later(self.clock.now(), delay) > deadline or self._stopped(entries)
            if not stop:
                await self.backoff(delay)
                # Leadership lost or the entries fenced while backing off: no attempt more (the
                # next holder sends them; to another broker, a late attempt would be a second).
                stop = self._stopped(entries)
            if stop:
                if error is not None and all(r is None for r in final):
                    raise error
                for i in todo:
                    if error is not None:
                        final[i] = EnqueueResult(tasks[i], "failed", None, error=str(error))
                return [r for r in final if r is not None]

    def _stopped(self, entries: list[ScheduledEntry]) -> bool:
        return not self.may_send() or self._fenced_any(entries)

    def _fenced_any(self, entries: list[ScheduledEntry]) -> bool:
        fenced = self.fence()
        return fenced is not None and any(fenced(e.ident) for e in entries)

    async def _safe_hook(self, hook: Callable[..., Any] | None, *args: Any) -> None:
        try:
            await _call(hook, *args)
        except Exception:  # a user hook must not stop the schedule
            log.exception("hook %r failed", hook)

    def hung_for(self, now: datetime) -> float:
        """Seconds a send under way has shown no sign of life (0 when none is under way)."""
        progress = self.progress_at
        if progress is None:
            return 0.0
        return max(0.0, (now - progress).total_seconds())
