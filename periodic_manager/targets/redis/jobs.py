"""One way for the job-queue targets on Redis (arq, RQ, Dramatiq) to send a batch: build each task's job,
decide the overlap tasks against their previous jobs, claim and write the jobs with the target's
script (one call per queue and chunk, a few calls at once), and report every task.

A target gives what differs: how a task becomes a job (:attr:`JobBatch.build`: raises TypeError
or ValueError for a task that cannot be one, which then fails alone) and how one script call is
made for some jobs of one queue (:attr:`JobBatch.call`: its reply is one flag per job,
:mod:`~periodic_manager.targets.redis.flags`). The rest is here: the flags read back as results,
a queue whose key holds another type failing its own tasks alone (the script refuses before it
writes anything), any other Redis failure raised as TargetError.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from periodic_manager.contracts import QUEUED, EnqueueResult, Previous, Task, refused
from periodic_manager.targets.base import overlap_of
from periodic_manager.targets.redis.errors import KeyTypeError, redis_errors
from periodic_manager.targets.redis.flags import BUSY, NEW, SENT, WRONGTYPE, wrong_type
from periodic_manager.targets.redis.previous import Decided, PreviousTasks


class Job(Protocol):
    @property
    def queue(self) -> str: ...


J = TypeVar("J", bound=Job)


@dataclass(slots=True)
class JobBatch(Generic[J]):
    """What one target sends a batch with (see the module docstring)."""

    name: str  # the target's name, in every error text ("arq", "rq", "dramatiq")
    build: Callable[[Task, datetime], J]
    # One script call for the jobs ``part`` (indices into tasks and jobs) of one queue: its
    # reply, a flag per job. Arguments: queue, part, tasks, jobs, decided, now.
    call: Callable[
        [str, list[int], Sequence[Task], dict[int, J], Decided | None, datetime],
        Awaitable[list[Any]],
    ]
    # None: the target cannot tell when a job finished; it refuses overlap tasks before the batch.
    previous: PreviousTasks | None
    timeout: float
    concurrency: int
    chunk: int

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        """Claim and write every task's job; report each task in input order. Raises
        TargetError when Redis fails (what a script wrote stays, and a retry finds it claimed)."""
        if not tasks:
            return []
        results: list[EnqueueResult | None] = [None] * len(tasks)
        jobs: dict[int, J] = {}
        for index, task in enumerate(tasks):
            try:
                jobs[index] = self.build(task, now)
            except (TypeError, ValueError) as exc:
                results[index] = refused(task, f"{self.name}: {exc}")
        send = [i for i in jobs if overlap_of(tasks[i]) == "allow"]
        after = [i for i in jobs if overlap_of(tasks[i]) != "allow"]
        decided: Decided | None = None
        if after:  # options.overlap: written only where the previous job finished
            assert self.previous is not None, "overlap tasks reach only a target that can tell"
            with redis_errors(f"{self.name}: previous jobs", self.timeout):
                async with asyncio.timeout(self.timeout):
                    decided = await self.previous.read(tasks, after, now, flag="1")
            for index, result in decided.results.items():
                results[index] = result
            send += decided.free
        flags = await self._write(tasks, jobs, send, decided, now)
        for index, flag in flags.items():
            results[index] = self._result(tasks[index], flag, decided, index)
        return [r for r in results if r is not None]

    def _result(
        self, task: Task, flag: int | str, decided: Decided | None, index: int
    ) -> EnqueueResult:
        if flag == NEW:
            result = EnqueueResult(task, "enqueued", task.id)
            if decided is not None and index in decided.previous:
                result.previous = decided.previous[index]
            return result
        if flag == SENT:
            return EnqueueResult(task, "duplicate", task.id)
        if flag == BUSY:  # another manager sent a job of this schedule since it was read
            return EnqueueResult(task, "busy", previous=Previous(None, QUEUED))
        if flag == WRONGTYPE:
            assert decided is not None  # only the previous-job key may be of another type
            return refused(task, wrong_type(self.name, decided.written[index][0]))
        # The error text of a call refused whole (KeyTypeError: the queue's key holds another
        # type, which no retry changes).
        return refused(task, str(flag))

    async def _write(
        self,
        tasks: Sequence[Task],
        jobs: dict[int, J],
        indices: list[int],
        decided: Decided | None,
        now: datetime,
    ) -> dict[int, int | str]:
        """Run the script for ``indices``, grouped by queue in chunks of :attr:`chunk`, at most
        :attr:`concurrency` calls at once; flags by index."""
        by_queue: dict[str, list[int]] = {}
        for index in indices:
            by_queue.setdefault(jobs[index].queue, []).append(index)
        calls = [
            (queue, part[start : start + self.chunk])
            for queue, part in by_queue.items()
            for start in range(0, len(part), self.chunk)
        ]
        gate = asyncio.Semaphore(self.concurrency)

        async def one(queue: str, part: list[int]) -> list[int | str]:
            async with gate:
                try:
                    with redis_errors(f"{self.name}: redis", self.timeout):
                        async with asyncio.timeout(self.timeout):
                            reply = await self.call(queue, part, tasks, jobs, decided, now)
                except KeyTypeError as exc:  # the queue's key is unusable: its tasks fail alone
                    return [str(exc)] * len(part)
            return [int(f) for f in reply]

        replies = await asyncio.gather(*(one(q, part) for q, part in calls))
        return {
            index: flag
            for (_, part), reply in zip(calls, replies, strict=True)
            for index, flag in zip(part, reply, strict=True)
        }
