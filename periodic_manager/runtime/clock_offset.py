"""This manager's wall clock measured against the database's, and its jumps noticed.

Slots are judged on the wall clock (a slot's instant is an instant of the wall clock), so a
manager whose wall clock is off sends early (ahead) or late and skips (behind), and one whose
clock jumps sees slots fall due all at once or not at all. The leases and their trust run on the
monotonic clock (:mod:`periodic_manager.runtime.partitions`) and liveness on the database's
(``db.store``); what is left is to know the wall clock can be trusted for slots.

:class:`ClockOffset` keeps the offset of this manager's wall clock from the database's
(``SELECT now()``, or the ``now()`` a lease round reads in its statement) bracketed by two
local readings: offset = the local wall clock at the middle of the round trip - the
database's answer, give or take half the round trip (a positive offset: this clock is ahead).

* within :data:`WARN_BOUND_S` (2 s): nothing is said;
* beyond it: one WARNING (and one INFO once back within it), ``/readyz`` shows the offset
  (``clock`` check, still ready), the ``periodic_manager_clock_offset_seconds`` gauge, and the
  managers page (``pm_managers.clock_offset_s``);
* beyond ``limit`` (``PM_GRACE / 4``, at least :data:`MIN_LIMIT_S`; the warning bound is at
  most the limit): :attr:`ClockOffset.agrees` is False: the manager takes no
  partition, drops those it holds and sends nothing (``/readyz``: not ready) until a measure
  finds its clock within the limit again.

A jump of the wall clock (:meth:`ClockOffset.tick`, called by the scheduler before every pass:
wall-clock progress against monotonic progress since the last tick, more than
:data:`JUMP_BOUND_S` apart) makes the offset unknown until measured again, and a measure is made
before the next send: what was measured before the jump says nothing of the clock after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from periodic_manager.clock import later
from periodic_manager.contracts import Clock
from periodic_manager.errors import cause

log = logging.getLogger(__name__)

WARN_BOUND_S = 2.0  # an offset beyond this is said (log, /readyz, metric, managers page)
JUMP_BOUND_S = 1.0  # wall-clock progress further than this from monotonic progress: a jump
MIN_LIMIT_S = 1.0  # the limit whatever the grace: a measure is only good to half a round trip
MEASURE_BOUND_S = 5.0  # a measure (SELECT now(), or a lease round) takes this long at most


@runtime_checkable
class Remeasuring(Protocol):
    """A part whose statements measure the offset (the partition leases: every round reads the
    database's now()); a round of it is the measure made after a jump."""

    offset: ClockOffset | None

    async def round(self) -> None: ...


class ClockOffset:
    """The offset of ``clock``'s wall time from the database's (see the module doc). ``limit``:
    seconds beyond which this manager holds and sends nothing (the grace / 4)."""

    def __init__(
        self,
        clock: Clock,
        *,
        limit: float,
        read: Callable[[], Awaitable[datetime | None]] | None = None,
    ) -> None:
        # A small grace (PM_GRACE may be 0) must not make every clock off: the limit is at
        # least MIN_LIMIT_S, and the warning bound (WARN_BOUND_S) at most the limit.
        self.clock = clock
        self.limit = max(limit, MIN_LIMIT_S)
        self.bound = min(WARN_BOUND_S, self.limit)
        self.jump_bound = JUMP_BOUND_S
        self.read = read  # the database's now(), when this manager measures on its own
        self.offset: float | None = None  # seconds this wall clock is ahead of the database's
        self.error: float | None = None  # give or take (half the round trip of the last measure)
        self.stale = False  # the wall clock jumped since the last measure
        self.jumps = 0
        self._said = False  # beyond the bound, said once
        self._refused = False  # beyond the limit, said once
        self._last: tuple[datetime, float] | None = None  # (wall, monotonic) at the last tick

    # -- measures ------------------------------------------------------------------------------

    def begin(self) -> tuple[datetime, float]:
        """The local readings before asking the database for its now()."""
        return self.clock.now(), self.clock.monotonic()

    def observe(self, before: tuple[datetime, float], database_now: object) -> None:
        """The database answered ``database_now`` to a question asked at ``before``
        (:meth:`begin`). An answer that is not an aware instant (the statement's column is
        data like any) measures nothing."""
        if not isinstance(database_now, datetime) or database_now.utcoffset() is None:
            return
        wall, sent = before
        half = max(0.0, self.clock.monotonic() - sent) / 2
        self.offset = (wall - database_now).total_seconds() + half
        self.error = half
        self.stale = False
        self._last = (self.clock.now(), self.clock.monotonic())
        self._say()

    async def measure(self) -> bool:
        """Measure now with :attr:`read` (False when there is none or it failed: the offset
        stays as it was, and a stale one stays stale)."""
        if self.read is None:
            return False
        before = self.begin()
        try:
            answer = await self.read()
        except Exception as exc:  # noqa: BLE001 - a failed measure changes nothing
            log.debug("clock offset: measure failed: %s", cause(exc))
            return False
        self.observe(before, answer)
        return True

    # -- jumps -----------------------------------------------------------------------------------

    def tick(self) -> bool:
        """Compare the wall clock's progress since the last tick with the monotonic clock's;
        True (and the offset unknown until measured again) when they differ by more than
        ``jump_bound``."""
        now, mono = self.clock.now(), self.clock.monotonic()
        last, self._last = self._last, (now, mono)
        if last is None:
            return False
        jump = (now - last[0]).total_seconds() - (mono - last[1])
        if abs(jump) <= self.jump_bound:
            return False
        self.jumps += 1
        self.stale = True
        log.warning(
            "the wall clock jumped %+.1f s (against the monotonic clock): measuring its offset "
            "from the database's before the next send",
            jump,
        )
        return True

    # -- what it means -------------------------------------------------------------------------

    @property
    def agrees(self) -> bool:
        """Whether slots may be judged on this wall clock: measured (or not measurable: no
        database clock) within ``limit``, and not jumped since."""
        if self.stale:
            return False
        return self.offset is None or abs(self.offset) <= self.limit

    def check(self) -> str:
        """``/readyz``'s ``clock`` check: ``ok``, ``skewed: ...`` (ready) or ``failed: ...``."""
        if self.stale:
            return "failed: the wall clock jumped; its offset from the database's is being measured"
        if self.offset is None or abs(self.offset) <= self.bound:
            return "ok"
        text = self._text()
        if abs(self.offset) > self.limit:
            return f"failed: {text}; sending nothing until it is within {self.limit:g} s"
        return f"skewed: {text}"

    def _text(self) -> str:
        assert self.offset is not None
        way = "ahead of" if self.offset > 0 else "behind"
        return (
            f"this clock is {abs(self.offset):.1f} s {way} the database's (bound {self.bound:g} s)"
        )

    def _say(self) -> None:
        assert self.offset is not None
        off = abs(self.offset)
        if off > self.limit and not self._refused:
            log.error(
                "%s: beyond %g s (the grace / 4) this manager takes no partition and sends "
                "nothing until its clock agrees",
                self._text(),
                self.limit,
            )
        elif off > self.bound and not self._said:
            log.warning("%s: fix the host's time synchronisation", self._text())
        elif off <= self.bound and self._said:
            log.info("this clock agrees with the database's again (%+.2f s)", self.offset)
        if off <= self.limit and self._refused:
            log.warning(
                "this clock is within %g s of the database's again: taking work", self.limit
            )
        self._said = off > self.bound
        self._refused = off > self.limit


class DatabaseTime:
    """A :class:`~periodic_manager.contracts.Clock` on the database's time as measured: the
    wall clock less the offset (once measured; beyond the limit nothing is sent anyway, and
    what this manager writes, e.g. its start in ``pm_managers``, is in the database's time).
    Slots are judged on it, so a manager whose clock is a few seconds ahead sends neither
    early nor, behind, late; its sleeps and the monotonic clock are the wall clock's."""

    def __init__(self, clock: Clock, offset: ClockOffset) -> None:
        self.wall = clock
        self.offset = offset

    def _shift(self) -> timedelta:
        off = self.offset.offset
        return timedelta(0) if off is None else timedelta(seconds=off)

    def now(self) -> datetime:
        return self.wall.now() - self._shift()

    def monotonic(self) -> float:
        return self.wall.monotonic()

    async def sleep(self, seconds: float) -> None:
        await self.wall.sleep(seconds)

    async def sleep_until(self, instant: datetime) -> None:
        await self.wall.sleep_until(later(instant, self._shift()))

    async def wait_until(self, event: asyncio.Event, instant: datetime) -> bool:
        return await self.wall.wait_until(event, later(instant, self._shift()))


class ClockWatch:
    """What a manager does with its :class:`ClockOffset`: measure it (bounded) at start and
    after every heartbeat of its own, and at every scheduler pass look for a jump, measured
    before the pass sends anything. ``rounds``: the lease rounds where they measure (a round
    after a jump also hands every partition over if the clock is off now)."""

    def __init__(
        self, offset: ClockOffset, rounds: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self.offset = offset
        self.rounds = rounds
        # Leader mode: step down when a measure finds the clock off (the pass that follows then
        # sends nothing); the leadership's own loop does not try again until it agrees.
        self.step_down: Callable[[], Awaitable[None]] | None = None

    async def measure(self, *, direct: bool = False) -> bool:
        """Measure now, bounded (False: no measure); ``direct``: by the offset's own read, not
        a lease round (at start, before the leases run)."""
        try:
            async with asyncio.timeout(MEASURE_BOUND_S):
                if self.rounds is None or direct:
                    return await self.offset.measure()
                await self.rounds()
                return True
        except TimeoutError:
            return False

    async def tick(self) -> None:
        """Before every scheduler pass (``Scheduler.on_tick``): a jump is measured before the next
        send; while unmeasured, the leases' fence sends nothing for the partitions."""
        if self.offset.tick():
            await self.measure()
            if self.step_down is not None and not self.offset.agrees:
                await self.step_down()
