"""Leadership: at most one manager schedules at a time; the others wait as hot standbys.

:class:`LockLeadership` holds the database's leader lock on a dedicated connection (never a
pooled one: the lock belongs to the session): a session-level advisory lock on PostgreSQL, a
named lock (``GET_LOCK``, session-level too) on MariaDB/MySQL
(:meth:`Database.leader_lock <periodic_manager.db.dialects.Database.leader_lock>`); the loop is
:class:`SessionLockLeadership`'s. Standbys try to take the lock every
``poll_interval``; the leader proves it still holds it with a round trip every ``poll_interval``.

Bounds (defaults: poll 1 s, timeout 3 s):

* the leader process dies: the server ends its session at once, the lock is free, a standby
  takes it at its next try: takeover <= ``poll_interval`` (+ connect time);
* the leader is cut off (network, half-open connection): the server ends the silent session after
  ``timeout`` (PostgreSQL: ``idle_session_timeout``, plus TCP keepalives; MariaDB/MySQL:
  ``wait_timeout``, whole seconds, at least 1) and a standby takes over
  <= ``timeout + poll_interval`` later. The cut-off leader stops enqueueing as soon as a check fails
  or takes longer than ``timeout - poll_interval`` — before the server can free the lock, since its
  last successful check was at most ``poll_interval`` earlier. It never enqueues on a lock it may
  have lost; the per-slot claim of the target is the second line of defence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, TypedDict, Unpack

from periodic_manager.clock import SystemClock
from periodic_manager.contracts import ChangeCallback, Clock
from periodic_manager.db.dialects import LEADER_LOCK_NAME, database_of
from periodic_manager.errors import cause
from periodic_manager.runtime.tasks import cancel_loop, cancelling, reraise_if_cancelled

log = logging.getLogger(__name__)


class AlwaysLeader:
    """Single-manager deployments (SQLite, tests): always the leader."""

    def __init__(self) -> None:
        self.is_leader = False
        self._on_change: ChangeCallback | None = None

    @property
    def task(self) -> asyncio.Task[None] | None:
        return None

    async def start(self, on_change: ChangeCallback) -> None:
        self._on_change = on_change
        await self._set(True)

    async def stop(self) -> None:
        await self._set(False)

    async def _set(self, value: bool) -> None:
        if value == self.is_leader:
            return  # report changes only
        self.is_leader = value
        if self._on_change is not None:
            result = self._on_change(value)
            if asyncio.iscoroutine(result):
                await result


class SessionLockLeadership(AlwaysLeader):
    """Leader election with a session-level lock on a dedicated connection: the loop, the checks
    and the bounds (module doc); a subclass says how to connect, take the lock and prove it."""

    def __init__(
        self, *, clock: Clock | None = None, poll_interval: float = 1.0, timeout: float = 3.0
    ) -> None:
        super().__init__()
        if timeout <= poll_interval:
            raise ValueError("leader timeout must be longer than the poll interval")
        self.clock: Clock = clock or SystemClock()
        self.poll_interval = poll_interval
        self.timeout = timeout
        self._conn: Any = None
        self._task: asyncio.Task[None] | None = None
        self._last_error: str | None = None
        self._stopping = False  # stop() under way: a failed check is no loss to report
        self._may_hold: Callable[[], bool] | None = None  # False: step down (target_health)
        # Whether this manager may lead now (its clock agrees with the database's,
        # runtime.clock_offset): while not, it steps down and does not try for the lock.
        self.may_lead: Callable[[], bool] = lambda: True

    def gate(self, may_hold: Callable[[], bool]) -> None:
        """Consult ``may_hold`` at every check: False (the targets do not answer) steps down
        (sending stops, then the lock's session closes) and takes no lock until it is True
        (:mod:`~periodic_manager.runtime.target_health`)."""
        self._may_hold = may_hold

    def wake(self) -> None:
        """Nothing to do: the next check comes within ``poll_interval``."""

    # -- what a database gives ------------------------------------------------------------------

    async def _connect(self) -> Any:
        """A new dedicated connection whose server ends it once silent for ``timeout``."""
        raise NotImplementedError

    async def _try_lock(self) -> bool:
        """Take the lock on ``self._conn`` without waiting; whether it is now held."""
        raise NotImplementedError

    async def _prove(self) -> None:
        """A round trip on ``self._conn`` proving the session (and so the lock) is alive."""
        raise NotImplementedError

    async def _close(self) -> None:
        """Close ``self._conn`` politely (the server frees the lock)."""
        raise NotImplementedError

    def _terminate(self) -> None:
        """Drop ``self._conn`` at once, without a round trip."""
        raise NotImplementedError

    # -- the loop ---------------------------------------------------------------------------------

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The background loop (the manager supervises it: its death is the manager's failure)."""
        return self._task

    async def start(self, on_change: ChangeCallback) -> None:
        self._on_change = on_change
        await self._attempt()
        self._task = asyncio.ensure_future(self._loop())
        self._task.set_name("periodic-manager-leadership")

    async def stop(self) -> None:
        # Step down first (enqueueing stops), then release the lock: never two leaders at once.
        self._stopping = True
        await self._set(False)
        await cancel_loop(self._task, self.timeout + self.poll_interval)
        self._task = None
        await self._end_session()

    async def _loop(self) -> None:
        while True:
            await self.clock.sleep(self.poll_interval)
            await self._attempt()

    async def step_down(self) -> None:
        """Stop leading now (enqueueing stops) and end the session, so a standby takes the
        lock at its next try; the loop tries again once :attr:`may_lead` allows it."""
        if self.is_leader:
            log.error("stepping down: this manager may not lead now (its clock is off)")
            await self._set(False)
        self._drop_connection()

    async def _attempt(self) -> None:
        if not self.may_lead():
            await self.step_down()
            return
        # A check must answer well before the server could free the lock of a silent session.
        budget = self.timeout - self.poll_interval
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancellation that
            # arrives as the check completes, and the loop would outlive stop()'s wait for it.
            async with asyncio.timeout(budget):
                await self._check_or_acquire()
        except Exception as exc:  # noqa: BLE001 - any failure means: leadership not proven
            if cancelling():
                # A driver may turn a cancellation into its own error: never swallow it, or
                # stop() would wait for this loop forever.
                self._drop_connection()
            reraise_if_cancelled(exc)
            msg = cause(exc)
            if self._stopping:
                # stop() steps down and closes the session itself: nothing was lost.
                log.debug("leadership check failed while stopping: %s", msg)
                self._drop_connection()
                return
            if msg != self._last_error:
                log.warning("leadership check failed: %s", msg)
            self._last_error = msg
            self._drop_connection()
            if self.is_leader:
                log.error("lost leadership (cannot prove it): enqueueing stops")
                await self._set(False)
            return
        self._last_error = None

    async def _check_or_acquire(self) -> None:
        if self._may_hold is not None and not self._may_hold():
            await self._stand_by()
            return
        if self._conn is None:
            self._conn = await self._connect()
        if self.is_leader:
            # A session-level lock lasts as long as the session: a round trip proves both.
            await self._prove()
            return
        if await self._try_lock():
            log.info("became leader")
            await self._set(True)

    async def _stand_by(self) -> None:
        """Step down as :meth:`stop` does (sending stops, then the session holding the lock
        closes: a standby takes it at its next try) and hold no connection meanwhile."""
        if self.is_leader:
            log.error("stepping down: this manager's targets do not answer (a standby takes over)")
            await self._set(False)
        await self._end_session()

    async def _end_session(self) -> None:
        """Close the session politely, bounded (closing it releases the lock: a standby takes
        over at its next try), then drop it whatever happened."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._close(), self.poll_interval)
            self._drop_connection()

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._terminate()
            self._conn = None


class LoopTimes(TypedDict, total=False):
    """The loop's settings (:class:`SessionLockLeadership`): its clock and bounds."""

    clock: Clock | None
    poll_interval: float
    timeout: float


class LockLeadership(SessionLockLeadership):
    """Leader election with the leader lock ``name`` of the database ``url`` names."""

    def __init__(
        self, url: str, *, name: str = LEADER_LOCK_NAME, **loop: Unpack[LoopTimes]
    ) -> None:
        super().__init__(**loop)
        self.lock = database_of(url).leader_lock(url, name=name, timeout=self.timeout)

    async def _connect(self) -> Any:
        return await self.lock.connect()

    async def _try_lock(self) -> bool:
        return await self.lock.try_lock(self._conn)

    async def _prove(self) -> None:
        await self.lock.prove(self._conn)

    async def _close(self) -> None:
        await self.lock.close(self._conn)

    def _terminate(self) -> None:
        self.lock.terminate(self._conn)
