"""What the job-queue targets on Redis (arq, RQ) share around their jobs: the client (and whether
the target owns it), the claims, the previous tasks and the sentinel in the same Redis, the batch
that sends (:class:`~periodic_manager.targets.redis.jobs.JobBatch`), and the ping, the sentinel's
question and the close. A target adds how a task becomes a job (``job``), its script call
(``_call``), its job states (``_states``) and outcomes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Self

from periodic_manager.contracts import EnqueueResult, Task
from periodic_manager.targets.redis.claims import RedisClaims
from periodic_manager.targets.redis.jobs import JobBatch
from periodic_manager.targets.redis.previous import Decided, PreviousTasks
from periodic_manager.targets.redis.sentinel import Sentinel


def bounded_pool(url: str, *, timeout: float, concurrency: int) -> Any:
    """A pool on ``url`` for ``concurrency`` script calls and one more connection (a ping, a
    sentinel look), every wait and socket bounded by ``timeout``: a caller waits for a free
    connection rather than fail with "Too many connections"."""
    import redis.asyncio as aioredis

    return aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=concurrency + 1,
        timeout=timeout,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
    )


class RedisJobTarget:
    """The shared part of a job-queue target on Redis (see the module doc)."""

    name: str
    chunk: int  # jobs per script call

    def __init__(self, client: Any, **options: Any) -> None:
        """A target takes its client and options, and calls :meth:`_share`."""
        raise NotImplementedError

    def _share(
        self,
        client: Any,
        script: str,
        *,
        prefix: str,
        claim_margin: float,
        timeout: float,
        concurrency: int,
    ) -> None:
        if timeout <= 0 or concurrency < 1:
            raise ValueError("timeout must be > 0 and concurrency >= 1")
        self.client = client
        self.claims = RedisClaims(client, prefix=prefix, margin=claim_margin)
        # A job written as the previous one counts as queued this long before the library must
        # know it.
        self.previous = PreviousTasks(self.claims, self._states, publish_window_s=2 * timeout)
        self.timeout = timeout
        self.concurrency = concurrency
        self.sentinel = Sentinel(client, f"{prefix}:sentinel", timeout=timeout)
        self._script = client.register_script(script)
        self._owns_client = False

    @classmethod
    def _client_on(cls, pool: Any) -> Any:
        """The client the target talks through, on ``pool``."""
        import redis.asyncio as aioredis

        return aioredis.Redis(connection_pool=pool)

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float = 5.0, concurrency: int = 8, **kwargs: Any
    ) -> Self:
        """A target with its own client on ``url`` (closed by :meth:`close`); no I/O until used."""
        pool = bounded_pool(url, timeout=timeout, concurrency=concurrency)
        target = cls(cls._client_on(pool), timeout=timeout, concurrency=concurrency, **kwargs)
        target._owns_client = True
        return target

    def job(self, task: Task, now: datetime) -> Any:
        raise NotImplementedError

    async def _call(self, *args: Any) -> list[Any]:
        raise NotImplementedError

    async def _states(self, job_ids: Sequence[str]) -> list[str]:
        raise NotImplementedError

    def _rows(
        self,
        part: Sequence[int],
        tasks: Sequence[Task],
        decided: Decided | None,
        now: datetime,
        job_fields: Callable[[int], list[Any]],
    ) -> list[list[Any]]:
        """The script's row of each job of ``part``: its claim (key, task id, claim TTL), what
        ``job_fields`` gives of the job at that index, then the previous task the overlap read
        recorded for it (``decided.written``), if any."""
        rows: list[list[Any]] = []
        for index in part:
            task = tasks[index]
            row = [task.idempotency_key, task.id, self.claims.ttl_ms(task, now)]
            row += job_fields(index)
            if decided is not None and index in decided.written:
                row += list(decided.written[index])
            rows.append(row)
        return rows

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        """Claim and write every task's job, one script per queue and ``chunk`` of jobs (at
        most ``concurrency`` at once); report each task in input order. A queue whose key holds
        another type fails its tasks alone. Raises TargetError when Redis fails (what a script
        wrote stays, and a retry finds it claimed)."""
        batch = JobBatch(
            self.name,
            self.job,
            self._call,
            self.previous,
            self.timeout,
            self.concurrency,
            self.chunk,
        )
        return await batch.enqueue(tasks, now)

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        """The library's own job status tells when a job finished."""
        return None

    def failure_off(self, options: Mapping[str, Any]) -> str | None:
        """The library's job status (or result) tells a failed job from one that succeeded."""
        return None

    async def ping(self) -> None:
        """Raise unless the Redis answers within ``timeout`` (a readiness check)."""
        async with asyncio.timeout(self.timeout):
            await self.claims.ping()

    async def forgotten(self) -> list[str]:
        """``[name]`` when the Redis lost its data since the previous call."""
        return [self.name] if await self.sentinel.lost() else []

    async def close(self) -> None:
        """Close the client if this target created it (:meth:`from_url`)."""
        if self._owns_client:
            await self.client.aclose()
            await self.client.connection_pool.disconnect()
