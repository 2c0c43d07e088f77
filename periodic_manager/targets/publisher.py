"""Publishing with a synchronous broker client (kombu for Celery, pika for Dramatiq on RabbitMQ):
one thread, a timeout that measures the broker.

Those clients are synchronous and their connections are not thread-safe, so every publish runs in
one thread of the publisher, one batch after the other. What a publish is comes from an
:class:`Outlet` (open a session with the broker, publish one message in it, close). Each broker operation (acquiring the producer, each
``send_task``) is timed from the moment it starts; a batch waiting for the thread is not timed,
so sub-batches queued behind a healthy broker never time out. When an operation in flight has
run longer than ``timeout``, the broker is declared stuck: every waiting batch stops (none of its
messages after the one in flight is started) and reports how far it got.

Durations are read with ``time.monotonic`` (a duration of I/O, not an instant of the schedule:
no clock involved).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

# How often a waiting batch re-checks the operation in flight when the thread is idle or just
# started a new operation (the check is cheap; this only bounds how late a stall is noticed).
_RECHECK_S = 0.25


class Outlet(Protocol):
    """How one broker client publishes (called only in the publishing thread)."""

    def session(self) -> AbstractContextManager[Callable[[Any], None]]:
        """A session with the broker (acquiring a producer, a channel): yields the function that
        publishes one message and returns once the broker took it (a publisher confirm)."""
        ...

    def close(self) -> None:
        """Close the client's connections."""
        ...


@dataclass
class Job:
    """One batch handed to the publishing thread (state shared under the publisher's lock)."""

    messages: Sequence[Any]
    future: asyncio.Future[None] | None = None
    stop: bool = False  # set by the waiter: start no further publish
    in_flight: bool = False  # a broker operation of this job has started and not returned
    sending: bool = False  # that operation is a publish (not the producer's connection)
    done: int = 0  # publishes that returned successfully
    # A publish that failed in a way that does not prove the broker never took it (a timeout,
    # a reset connection, a lost confirmation): its outcome is unknown.
    unknown: bool = False
    error: BaseException | None = None


class ThreadPublisher:
    """Publishes messages through ``outlet`` in one thread named ``<thread_name>``."""

    def __init__(self, outlet: Outlet, timeout: float, thread_name: str) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        self.outlet = outlet
        self.timeout = timeout
        self._lock = threading.Lock()
        self._busy_since: float | None = None  # start of the broker operation in flight
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=thread_name
        )

    def start(self, messages: Sequence[Any]) -> Job:
        """Queue ``messages`` for the publishing thread (in order, after earlier jobs)."""
        job = Job(messages)
        job.future = asyncio.get_running_loop().run_in_executor(self._executor, self._run, job)
        return job

    async def wait(self, job: Job) -> tuple[int, int, BaseException | None]:
        """(How many of the job's messages the broker took, how many more may have reached it,
        the error that stopped it). The messages are published in order: the first are taken,
        then at most one whose outcome is unknown (in flight on a broker that did not answer
        within a second ``timeout``), then those never started.
        """
        assert job.future is not None
        while not job.future.done():
            if self._overdue():
                return await self._give_up(job)
            await asyncio.wait({job.future}, timeout=self._wait_s())
        return job.done, int(job.unknown), job.error

    def stop(self, job: Job) -> tuple[int, int]:
        """Start no further publish of ``job``; (how many the broker took, how many more may
        have reached it: the one in flight)."""
        with self._lock:
            job.stop = True
            return job.done, (1 if job.in_flight else 0)

    def _overdue(self) -> bool:
        """Whether the broker operation in flight (of any job) has run longer than ``timeout``."""
        with self._lock:
            since = self._busy_since
        return since is not None and time.monotonic() - since > self.timeout

    def _wait_s(self) -> float:
        with self._lock:
            since = self._busy_since
        if since is None:
            return _RECHECK_S
        return max(0.0, self.timeout - (time.monotonic() - since)) + 0.01

    async def _give_up(self, job: Job) -> tuple[int, int, BaseException | None]:
        assert job.future is not None
        with self._lock:
            job.stop = True
            in_flight = job.in_flight
        if in_flight:
            # Our own publish is stuck: give it one more timeout to finish, so its outcome is known.
            await asyncio.wait({job.future}, timeout=self.timeout)
        with self._lock:
            done, still, error = job.done, job.in_flight or job.unknown, job.error
        if done == len(job.messages):
            return done, 0, None  # it all went out after all
        # A publish still in flight may yet reach the broker (the caller keeps its claim
        # pending: the retry publishes it again); the ones after it were never started.
        stuck = TimeoutError(f"the broker did not answer a publish within {self.timeout:g} s")
        return done, (1 if still else 0), error or stuck

    def _begin(self, job: Job) -> bool:
        with self._lock:
            if job.stop:
                return False
            job.in_flight = True
            self._busy_since = time.monotonic()
            return True

    def _end(self, job: Job, ok: bool) -> None:
        with self._lock:
            job.in_flight = False
            self._busy_since = None
            if ok:
                job.done += 1

    def _run(self, job: Job) -> None:
        try:
            if not self._begin(job):  # acquiring the producer may connect: timed as well
                return
            with self.outlet.session() as publish:
                self._end(job, ok=False)
                for msg in job.messages:
                    if not self._begin(job):
                        return
                    job.sending = True
                    publish(msg)
                    job.sending = False
                    self._end(job, ok=True)
        except Exception as exc:  # kombu, pika and the transports raise a wide spread of types
            job.error = exc
            job.unknown = job.sending and not _refused(exc)
        finally:
            if job.in_flight:
                self._end(job, ok=False)
            if job.stop and job.error is None and job.done < len(job.messages):
                job.error = RuntimeError("stopped before every message was published")

    def close_outlet(self) -> concurrent.futures.Future[None]:
        """Close the outlet's connections in the publishing thread (after any publish under way)."""
        return self._executor.submit(self.outlet.close)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False)


def _refused(exc: BaseException) -> bool:
    """Whether ``exc`` proves that nothing reached the broker: the connection was refused (no
    broker listens). Anything else (a timeout, a reset, a lost confirmation) leaves the outcome
    of the publish unknown."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ConnectionRefusedError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False
