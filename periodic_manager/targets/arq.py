"""arq target: each slot becomes an arq job, ``enqueue_job(task_type, ..., _job_id=<task id>)``.

Needs the ``arq`` extra (``pip install 'periodic-manager[arq]'``); arq is imported only when a
target is built, so the core runs without it.

- payload -> arguments: a JSON object becomes keyword arguments, an array positional arguments,
  ``null`` no arguments, any other value one positional argument (after arq's ``ctx``);
- ``_job_id`` = the task id (uuid5 of the idempotency key: the same on every manager), so the
  worker sees it as ``ctx["job_id"]``;
- ``options.queue`` -> ``_queue_name`` (without it: the pool's default queue, ``arq:queue``);
  ``options.extra.expires`` (seconds after the slot) -> ``_expires`` (arq drops a job not started
  by then). ``timeout``, ``max_retry`` and ``unique_ttl`` are set on the worker's functions in arq
  and are not sent.

Exactly once per slot: arq itself refuses a job id while the job is queued (its key lives until
the job runs, at most ``_expires``, by default a day) and while its result is kept (the worker's
``keep_result``, 3600 s by default, possibly 0). That alone could let a slot through twice if a
worker finished it and dropped the result within grace, so the slot is also claimed in Redis
(:class:`RedisClaims`) before ``enqueue_job``, for ``(expires_at - now) + margin``.

``options.overlap`` skip and hold: the previous job of a schedule is finished when arq holds
neither its job key (queued, deferred, or waiting for a retry) nor its in-progress key (running):
arq's own job status, read from the same Redis. The claim then compares the schedule's
previous-job key (:mod:`previous`), so two managers never both start a job of one schedule.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from redis.exceptions import RedisError

from periodic_manager.errors import TargetError
from periodic_manager.targets.base import (
    FINISHED,
    QUEUED,
    RUNNING,
    EnqueueResult,
    Task,
    overlap_of,
)
from periodic_manager.targets.claims import RedisClaims, split_payload
from periodic_manager.targets.previous import Decided, PreviousTasks
from periodic_manager.targets.sentinel import Sentinel

log = logging.getLogger(__name__)

# Keyword names enqueue_job keeps for itself; a payload key among them would be swallowed.
RESERVED_KWARGS = frozenset(
    {"function", "_job_id", "_queue_name", "_defer_until", "_defer_by", "_expires", "_job_try"}
)


def _import_arq() -> Any:
    try:
        import arq.connections
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise TargetError("the arq target needs arq: pip install 'periodic-manager[arq]'") from exc
    return arq.connections


def arq_call(task: Task, now: datetime) -> tuple[list[Any], dict[str, Any]]:
    """Positional and keyword arguments of ``enqueue_job`` for ``task`` (ValueError if bad)."""
    args, kwargs = split_payload(task.payload)
    reserved = sorted(RESERVED_KWARGS & kwargs.keys())
    if reserved:
        raise ValueError(f"payload key(s) {', '.join(reserved)} are reserved by arq's enqueue_job")
    call: dict[str, Any] = dict(kwargs)
    call["_job_id"] = task.id
    if "queue" in task.options:
        call["_queue_name"] = task.queue
    extra = task.options.get("extra") or {}
    expires = extra.get("expires") if isinstance(extra, dict) else None
    if expires is not None:
        if isinstance(expires, bool) or not isinstance(expires, int | float):
            raise ValueError("options.extra.expires must be a number of seconds")
        if not math.isfinite(expires) or expires <= 0:
            raise ValueError("options.extra.expires must be > 0")
        end = task.scheduled_at.astimezone(UTC) + timedelta(seconds=expires)
        # arq counts _expires from the enqueue; 0 would mean "the default", so at least 1 ms.
        call["_expires"] = max(timedelta(milliseconds=1), end - now.astimezone(UTC))
    return [task.task_type, *args], call


class ArqTarget:
    """Enqueues tasks as arq jobs, once per idempotency key.

    ``pool``: an ``arq.connections.ArqRedis`` (its serializer must match the workers'; the claims
    live in the same Redis). At most ``concurrency`` ``enqueue_job`` calls run at once, each
    bounded by ``timeout`` seconds, as is the claim step.
    """

    name = "arq"
    completion = True  # arq's job status (see options.overlap in the module docstring)

    def __init__(
        self,
        pool: Any,
        *,
        prefix: str = "pm",
        claim_margin: float = 60.0,
        timeout: float = 5.0,
        concurrency: int = 8,
    ) -> None:
        if timeout <= 0 or concurrency < 1:
            raise ValueError("timeout must be > 0 and concurrency >= 1")
        self.pool = pool
        self.claims = RedisClaims(pool, prefix=prefix, margin=claim_margin)
        # A job written as the previous one counts as queued this long before arq must know it.
        self.previous = PreviousTasks(self.claims, self._states, publish_window_s=2 * timeout)
        self.timeout = timeout
        self.concurrency = concurrency
        self.sentinel = Sentinel(pool, f"{prefix}:sentinel")
        self._owns_pool = False

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float = 5.0, concurrency: int = 8, **kwargs: Any
    ) -> ArqTarget:
        """A target with its own pool on ``url`` (closed by :meth:`close`); no I/O until used."""
        connections = _import_arq()
        import redis.asyncio as aioredis

        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=concurrency + 1,
            timeout=timeout,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
        )
        target = cls(
            connections.ArqRedis(pool),
            timeout=timeout,
            concurrency=concurrency,
            **kwargs,
        )
        target._owns_pool = True
        return target

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        """Claim every task, enqueue the claimed ones as jobs, report each in input order."""
        if not tasks:
            return []
        results: list[EnqueueResult | None] = [None] * len(tasks)
        calls: dict[int, tuple[list[Any], dict[str, Any]]] = {}
        for index, task in enumerate(tasks):
            try:
                calls[index] = arq_call(task, now)
            except (TypeError, ValueError) as exc:
                results[index] = EnqueueResult(task, "failed", error=f"arq: {exc}")
        order = [i for i in calls if overlap_of(tasks[i]) == "allow"]
        after = [i for i in calls if overlap_of(tasks[i]) != "allow"]
        decided: Decided | None = None
        try:
            async with asyncio.timeout(self.timeout):
                won = await self.claims.claim([tasks[i] for i in order], now)
                if after:  # options.overlap: claimed only where the previous job finished
                    decided = await self.previous.decide(tasks, after, now)
        except TimeoutError as exc:
            raise TargetError(f"arq: claims not answered within {self.timeout:g} s") from exc
        claimed = [i for i, ok in zip(order, won, strict=True) if ok]
        for index, ok in zip(order, won, strict=True):
            if not ok:
                results[index] = EnqueueResult(tasks[index], "duplicate", tasks[index].id)
        if decided is not None:
            for index, result in decided.results.items():
                results[index] = result
            claimed += decided.claimed
        outcomes = await self._enqueue_jobs([calls[i] for i in claimed])
        failed: list[int] = []
        errors: list[BaseException] = []
        for index, outcome in zip(claimed, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                failed.append(index)
                errors.append(outcome)
            elif outcome is None:  # arq already holds this job id (queued, or its result kept)
                results[index] = EnqueueResult(tasks[index], "duplicate", tasks[index].id)
            else:
                results[index] = EnqueueResult(tasks[index], "enqueued", tasks[index].id)
            if decided is not None and index in decided.written:
                results[index].previous = decided.previous[index]  # type: ignore[union-attr]
        if decided is not None:
            await self._settle(decided, failed)
        if failed:
            # A job whose enqueue failed ambiguously (the reply lost after EXEC) is still
            # refused by arq on the retry, as its job key exists.
            try:
                await self.claims.release([tasks[i] for i in failed])
            except TargetError as exc:
                log.error(
                    "could not release %d claim(s) (they expire by themselves): %s",
                    len(failed),
                    exc,
                )
            first = errors[0]
            raise TargetError(
                f"arq: {len(failed)} of {len(claimed)} job(s) not enqueued: "
                f"{type(first).__name__}: {first}"
            ) from first
        return [r for r in results if r is not None]

    async def _settle(self, decided: Decided, failed: list[int]) -> None:
        """Mark the previous-job keys of the jobs sent, and put back those of jobs not sent."""
        sent = [i for i in decided.claimed if i not in set(failed)]
        try:
            async with asyncio.timeout(self.timeout):
                await self.previous.published(decided, sent)
                unsent = [i for i in failed if i in decided.written]
                await self.previous.unpublished(decided, unsent)
        except (TargetError, TimeoutError) as exc:
            # Flag 0 keeps a sent job "queued" only for the publish window; a key not put back
            # names a job arq does not hold: finished. Either way nothing is blocked for long.
            log.warning("arq: could not update previous-job keys: %s", exc)

    async def _states(self, job_ids: list[str]) -> list[str]:
        """arq's status of each job: running (in progress), queued (its job key exists: queued,
        deferred or waiting for a retry), else finished (done, or never enqueued)."""
        from arq.constants import in_progress_key_prefix, job_key_prefix

        try:
            async with self.pool.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.exists(in_progress_key_prefix + job_id)
                    pipe.exists(job_key_prefix + job_id)
                replies = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise TargetError(f"arq: job status: {type(exc).__name__}: {exc}") from exc
        states = []
        for k in range(len(job_ids)):
            running, queued = replies[2 * k], replies[2 * k + 1]
            states.append(RUNNING if running else QUEUED if queued else FINISHED)
        return states

    async def _enqueue_jobs(
        self, calls: list[tuple[list[Any], dict[str, Any]]]
    ) -> list[object | BaseException]:
        """``enqueue_job`` for each call (at most ``concurrency`` at once, each within timeout)."""
        gate = asyncio.Semaphore(self.concurrency)

        async def one(args: list[Any], kwargs: dict[str, Any]) -> object:
            async with gate:
                try:
                    async with asyncio.timeout(self.timeout):
                        return await self.pool.enqueue_job(*args, **kwargs)
                except (RedisError, OSError, TimeoutError) as exc:
                    return exc

        return list(await asyncio.gather(*(one(a, k) for a, k in calls)))

    async def ping(self) -> None:
        """Raise unless arq's Redis answers within ``timeout`` (a readiness check)."""
        async with asyncio.timeout(self.timeout):
            await self.claims.ping()

    async def forgotten(self) -> list[str]:
        """``["arq"]`` when arq's Redis lost its data since the previous call."""
        async with asyncio.timeout(self.timeout):
            return [self.name] if await self.sentinel.lost() else []

    async def close(self) -> None:
        """Close the pool if this target created it (:meth:`from_url`)."""
        if self._owns_pool:
            await self.pool.aclose()
            await self.pool.connection_pool.disconnect()
