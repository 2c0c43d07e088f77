"""Sending one instant's slots: tasks, sub-batches, first attempts, outcomes.

A batch goes out as sub-batches of ``SEND_CHUNK`` tasks, a few in flight at once so the target
works on one while the next is handed over. The scheduler's loop awaits the first attempt only:
what it settled (enqueued, duplicate, busy, and the tasks the target refused for good,
``EnqueueResult.permanent``) is recorded at once, and the tasks that failed in a way a retry may
mend (a call that raised, a task failed alone and not for good) go to a background retry
(:mod:`~periodic_manager.engine.retries`), so one failing schedule never holds another's next
instant. Every outcome becomes a run (enqueued, duplicate, failed) for the history and the
metrics, and the hooks see each sub-batch.
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
    SlotReason,
    StagedTarget,
    Task,
    failure_reason,
    retryable,
    run_status,
)
from periodic_manager.engine.history import RunWriter
from periodic_manager.engine.lines import log_slots
from periodic_manager.engine.retries import Retries
from periodic_manager.errors import TargetError, TaskRefused, cause
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.instants import slot_text
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
    after, ``on_error(exc, tasks)`` when its slots could not be sent: refused by the target for
    good (at once), or still failing at the end of their window (grace)."""

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
        log.debug("prepare failed, the batch is encoded when sent: %s", cause(exc))
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
        self.backoff = backoff  # a retry's pause, cut short on stop, fence and stepping down (never the loop's own wait)
        self.may_send = may_send  # False when stopping or no longer leading: no more retries
        self.hooks = hooks
        self.retry_base = retry_base
        self.retry_max = retry_max
        self.counts: dict[str, int] = {
            "enqueued": 0,
            "duplicate": 0,
            "resent": 0,
            "skipped": 0,
            "failed": 0,
            "held": 0,
        }
        self.progress_at: datetime | None = None  # last sign of life of a send under way
        self.failing = 0  # consecutive failed attempts (one log line per outage)
        self._inflight = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._sending = 0  # sub-batches under way, first attempts and retries
        self._attempting = 0  # target calls under way
        self._no_attempt = asyncio.Event()
        self._no_attempt.set()
        self._refusals: dict[str, str | None] = {}  # schedule -> refusal last logged (once each)
        self.retries = Retries(self, limit=MAX_IN_FLIGHT)

    def start(self, slot: datetime, chunks: list[Chunk]) -> list[asyncio.Future[None]]:
        """Start sending every sub-batch (at most ``MAX_IN_FLIGHT`` awaiting the target); the
        futures end after the first attempt (retries go on in the background)."""
        return [asyncio.ensure_future(self._send_chunk(slot, part, prep)) for part, prep in chunks]

    def begin(self) -> None:
        """A send (a first attempt, or a retry) starts: :meth:`hung_for` watches it."""
        self._sending += 1

    def end(self) -> None:
        self._sending -= 1
        if not self._sending:
            self.progress_at = None

    async def _send_chunk(
        self, slot: datetime, entries: list[ScheduledEntry], prepared: Prepared
    ) -> None:
        self.begin()
        try:
            await self._send_chunk_once(slot, entries, prepared)
        finally:
            self.end()

    async def _send_chunk_once(
        self, slot: datetime, entries: list[ScheduledEntry], prepared: Prepared
    ) -> None:
        tasks = prepared.tasks
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
                try:
                    results = await self.attempt(
                        send_prepared(self.target, prepared, self.clock.now())
                    )
                except Exception as exc:  # noqa: BLE001 - any target failure is reported, never fatal
                    if not self.retries.take(slot, entries, tasks, exc):
                        await self.give_up(slot, entries, tasks, exc)
                    return
        except Exception as exc:  # noqa: BLE001 - a pre_enqueue hook that raised: not sent
            await self.give_up(slot, entries, tasks, exc)
            return
        retry = [i for i, res in enumerate(results) if retryable(res)]
        if retry and self.retries.take(
            slot, [entries[i] for i in retry], [tasks[i] for i in retry], results[retry[0]].error
        ):
            again = set(retry)
            entries = [e for i, e in enumerate(entries) if i not in again]
            results = [r for i, r in enumerate(results) if i not in again]
        elif not retry:
            self.recovered()
        await self.settle(slot, entries, results)

    async def attempt(self, send: Awaitable[list[EnqueueResult]]) -> list[EnqueueResult]:
        """One call of the target (a first attempt or a retry), watched by :meth:`hung_for`."""
        self._attempting += 1
        self._no_attempt.clear()
        self.progress_at = self.clock.now()
        try:
            results = await send
        except TaskRefused:
            raise
        except Exception:
            self.retries.note(answered=False)  # down: the retries probe it one at a time
            raise
        else:
            self.retries.note(answered=True)
            return results
        finally:
            self.progress_at = self.clock.now()
            self._attempting -= 1
            if not self._attempting:
                self._no_attempt.set()

    async def between_attempts(self) -> None:
        """Return once no target call is under way. Every retry asks the fence right before its
        call, so after a fence is set and this returned, nothing more is sent for what it fences
        (a hand-over waits for this before it records what was sent)."""
        await self._no_attempt.wait()

    def recovered(self, retrying: int = 0) -> None:
        """A send went through whole: the outage ended, unless other retries (``retrying``
        besides the caller) still go on."""
        if self.failing and self.retries.active <= retrying:
            log.warning("target recovered after %d failed attempt(s)", self.failing)
            self.failing = 0

    async def settle(
        self, slot: datetime, entries: list[ScheduledEntry], results: list[EnqueueResult]
    ) -> None:
        """Record the final outcome of each of ``entries`` (``results``, in the same order)."""
        if not entries:
            return
        runs: list[RunRecord] = []
        at = self.clock.now()
        counts = self.counts
        overlap = self.overlap
        held = overlap.held if overlap is not None else {}
        failed: dict[str, list[Task]] = {}
        said: dict[tuple[bool, str], list[str]] = {}  # (refused for good, why): schedules
        for entry, res in zip(entries, results, strict=True):
            status = res.status
            if res.error is not None or entry.next_slot is not None:  # keep "no slot left"
                entry.last_error = res.error  # set when the target failed this task alone
            if status == "failed":
                failed.setdefault(res.error or "failed", []).append(res.task)
                if self._news(entry, res):
                    said.setdefault((res.permanent, res.error or "failed"), []).append(entry.name)
            elif self._refusals:
                self._refusals.pop(entry.config.name, None)  # a refusal again is said again
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
                    entry.key,
                    entry.name,
                    slot,
                    run_status(status),
                    at,
                    res.message_id,
                    res.error,
                    reason=failure_reason(res),
                    limited=entry.runs_left is not None,
                )
            )
        log.debug(
            "enqueued %d task(s) due %s",
            len(results),
            slot.isoformat(),
            extra={"slot": slot.isoformat()},
        )
        for (permanent, why), names in said.items():
            what = (
                "enqueue refused by the target (not retried) for"
                if permanent
                else "enqueue failed for"
            )
            log_slots(log, logging.ERROR, what, slot, names, why)
        await self._safe_hook(self.hooks.post_enqueue, results)
        for error, tasks in failed.items():
            await self._safe_hook(self.hooks.on_error, TargetError(error), tasks)
        self.writer.report(runs)

    def _news(self, entry: ScheduledEntry, res: EnqueueResult) -> bool:
        """Whether the failure ``res`` of ``entry`` is to be said: a refusal for good once per
        schedule and reason (a schedule due every second would repeat it every second: its runs
        and ``last_error`` say it each time), any other failure each time."""
        if not res.permanent:
            return True
        name = entry.config.name
        if self._refusals.get(name) == res.error:
            return False
        if len(self._refusals) >= 10000:
            self._refusals.clear()
        self._refusals[name] = res.error
        return True

    async def give_up(
        self,
        slot: datetime,
        entries: list[ScheduledEntry],
        tasks: list[Task],
        exc: BaseException,
        quiet: bool = False,
    ) -> None:
        """Record ``entries`` failed with ``exc`` (a call that raised, or a retry given up; quiet:
        stopping or no longer sending, a warning instead of an error) and tell ``on_error``."""
        at = self.clock.now()
        why: SlotReason = "refused" if isinstance(exc, TaskRefused) else "target-down"
        for entry in entries:
            entry.last_error = str(exc)
        self.counts["failed"] += len(tasks)
        if self.overlap is not None:
            self.overlap.drop(entries, slot)
        (log.warning if quiet else log.error)(
            "gave up on %d task(s) due %s: %s",
            len(tasks),
            slot.isoformat(),
            cause(exc),
            extra={"slot": slot.isoformat(), "batch": len(tasks)},
        )
        self.writer.report(
            [
                RunRecord(e.key, e.config.name, slot, "failed", at, error=str(exc), reason=why)
                for e in entries
            ]
        )
        await self._safe_hook(self.hooks.on_error, exc, tasks)

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
