"""A manager's background tasks: named, watched, and never dying quietly.

Every loop of a manager (the scheduler, the sync loop, the heartbeat, the publisher, the broker
watch) and every loop of its collaborators (leadership, change signals) is supervised: if one
ends with an error, or ends at all while the manager runs, the manager is unhealthy from then on
(the ``manager`` command exits non-zero, ``/healthz`` fails) and says why in one CRITICAL line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from periodic_manager.contracts import SignalCallback
from periodic_manager.errors import cause

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0
# Tasks that end by themselves once their work is done (any other ending is a failure).
ONE_SHOT = ("catch-up", "takeover", "drop")


def cancelling() -> bool:
    """Whether the current task is being cancelled (whatever error a driver raised instead)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def reraise_if_cancelled(exc: BaseException) -> None:
    """Drivers may turn a cancellation into their own error (asyncpg, SQLAlchemy): a loop that
    catches Exception must not swallow it, or ``stop()`` would wait for it forever."""
    if cancelling():
        raise asyncio.CancelledError() from exc


async def cancel_loop(task: asyncio.Task[Any] | None, wait_s: float) -> None:
    """Cancel a collaborator's background loop and wait for it to end, at most ``wait_s``
    seconds (a loop stuck in a call that ignores the cancellation is left behind, not waited
    for forever)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, TimeoutError):
        await asyncio.wait_for(task, wait_s)


class SignalLoop:
    """A :class:`~periodic_manager.contracts.ChangeSignal` whose loop (:meth:`_run`) runs as a
    task of its own, named ``periodic-manager-<name>``, calling :attr:`on_change`; stopped
    within ``timeout``."""

    name = "signal"

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.on_change: SignalCallback = lambda _partitions: None
        self._task: asyncio.Task[None] | None = None

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The background loop (the manager supervises it: its death is the manager's failure)."""
        return self._task

    async def start(self, on_change: SignalCallback) -> None:
        """Start the loop in the background (returns at once)."""
        self.on_change = on_change
        self._task = asyncio.ensure_future(self._run())
        self._task.set_name(f"periodic-manager-{self.name}")

    async def stop(self) -> None:
        await cancel_loop(self._task, self.timeout)
        self._task = None

    async def _run(self) -> None:
        raise NotImplementedError


class Supervisor:
    """Runs and watches named tasks; ``running()`` says whether an ending is unexpected."""

    def __init__(self, running: Callable[[], bool]) -> None:
        self._running = running
        self._tasks: list[asyncio.Task[Any]] = []
        self.failed: BaseException | None = None
        self.failed_task: str | None = None
        self.died = asyncio.Event()  # set with ``failed``: whoever watches health wakes at once

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(f"periodic-manager-{name}")
        task.add_done_callback(self._done)
        self._tasks.append(task)
        return task

    def watch(self, task: asyncio.Task[Any] | None) -> None:
        """Watch a long-lived task of a collaborator (leadership, change listener) like our own."""
        if task is not None:
            task.add_done_callback(self._done)

    async def stop(self, *, keep: str | None = None) -> None:
        """Cancel every task (but the one whose name ends with ``keep``: it stops by itself) and
        wait for them, bounded: a task that does not end (a driver that swallowed its
        cancellation, say) is reported by name instead of hanging the shutdown."""
        for task in self._tasks:
            if keep is None or not task.get_name().endswith(keep):
                task.cancel()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=STOP_TIMEOUT_S)
            for task in pending:
                log.error(
                    "%s did not stop within %.0f s; abandoned", task.get_name(), STOP_TIMEOUT_S
                )
        self._tasks.clear()

    def _done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        name = task.get_name()
        if exc is None:
            if not self._running() or name.endswith(ONE_SHOT):
                return
            exc = RuntimeError("ended unexpectedly")
        # A supervised loop must never die quietly: the process stops being healthy (the CLI
        # exits non-zero, /healthz fails) and says why in one line; the traceback is at DEBUG.
        if self.failed is None:
            self.failed = exc
            self.failed_task = name
            self.died.set()
        log.critical("%s died: %s", name, cause(exc))
        log.debug("%s traceback", name, exc_info=exc)
