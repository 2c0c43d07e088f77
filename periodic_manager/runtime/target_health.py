"""Whether a manager can do the work it holds: its targets answer their pings.

A manager with a wrong broker URL, or whose broker went away, used to keep its share of the
partitions (and renew their leases) while every slot of them failed. :class:`TargetHealth` pings
each target of the manager (each one behind a routing target on its own) every ``interval_s``
seconds on the clock's ticks, each ping bounded by 4/5 of it. After ``failures`` consecutive
failed pings of **every** target that can be pinged, the manager *stands down*:

* with partition leases it claims no partition and hands over those it holds, through the
  clean hand-over a joining manager gets (the sends for them stop at once, what was sent is
  flushed, the leases are released and announced): the others take them within a round trip.
  A manager standing down is no member of the fleet (the others' fair shares count it out), so
  a manager whose every target is down never holds the work of a manager whose targets answer.
  When no manager whose targets answer is live (the broker is down for everyone) it keeps what
  it holds and takes nothing: moving the work would help nobody, and it sends again as soon as
  the broker is back;
* with one leader (``PM_COORDINATION=leader``) it steps down (sending stops, then the lock's
  session closes) and tries for the lock again only once a target answers.

The first answering ping of any target ends it: the manager takes part again (a join,
announced: the holders hand its share over at once). A target that cannot be pinged (in memory,
custom) counts as answering, and so does one that writes into the manager's own database (the outbox,
procrastinate on the manager's engine: every lease round proves that database). With several targets (``PM_TARGETS``) a manager whose targets are
only partly down keeps its share: the schedules of the targets that answer go on, the others'
slots fail as on any manager, and ``/readyz`` names the targets that do not answer. A manager
that always leads (SQLite, ``PM_LEADER_ELECTION=false``) has nobody to hand its work to and does
not ping (``run``'s ``/readyz`` still checks its target).

What a leadership must offer to be stood down: :class:`Gated`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Protocol, runtime_checkable

from periodic_manager.clock import next_tick
from periodic_manager.contracts import Clock, InManagerDatabase, Pingable, Target
from periodic_manager.runtime.causes import explain
from periodic_manager.runtime.probe import ping_each

log = logging.getLogger(__name__)

# The pings come on the ticks of the lease rounds at the default TTL (every 5 s), so a manager at
# rest wakes no more often for them (measured at rest, 1,000 schedules: 0.025 CPU-s a minute
# against 0.020 without pings; every 2 s: 0.060). Two failures in a row: one blip is no outage,
# and a manager stands down 5 s after its first failed ping.
DEFAULT_INTERVAL_S = 5.0
DEFAULT_FAILURES = 2
# A ping is bounded by this share of the interval, so one that never answers ends before the
# next tick (which would otherwise be skipped).
PING_BOUND = 0.8


@runtime_checkable
class Gated(Protocol):
    """A leadership that asks, before it takes or keeps work, whether it may (``may_hold``)."""

    def gate(self, may_hold: Callable[[], bool]) -> None:
        """Consult ``may_hold`` at every round or check: False means take nothing and hand
        over (or step down from) what is held."""
        ...

    def wake(self) -> None:
        """The answer of ``may_hold`` changed: act on it now rather than at the next round."""
        ...


def targets_of(target: Target) -> Mapping[str, Target]:
    """The targets behind ``target`` by name (a routing target's, or itself alone)."""
    inner = getattr(target, "targets", None)
    if isinstance(inner, Mapping) and inner:
        return inner
    return {target.name: target}


def ping_error(exc: BaseException, timeout_s: float) -> str:
    """One line for a failed ping (a timeout says its bound)."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    return f"{type(exc).__name__}: {explain(exc)}"


class TargetHealth:
    """Pings the targets of ``target`` and tells whether the manager may hold work (see the
    module doc). ``changed`` is called with the new answer of :meth:`may_hold` whenever it
    changes."""

    def __init__(
        self,
        target: Target,
        *,
        clock: Clock,
        interval_s: float = DEFAULT_INTERVAL_S,
        failures: int = DEFAULT_FAILURES,
        changed: Callable[[bool], None] | None = None,
    ) -> None:
        if failures < 1 or not interval_s > 0:
            raise ValueError("target pings need a positive interval and at least one failure")
        self.clock = clock
        self.interval_s = interval_s
        self.failures = failures
        # A target in the manager's own database is proven by every lease round: not pinged.
        self.targets = {
            n: t
            for n, t in targets_of(target).items()
            if isinstance(t, Pingable)
            and not (isinstance(t, InManagerDatabase) and t.in_manager_database)
        }
        self._changed = changed
        self._failed: dict[str, int] = dict.fromkeys(self.targets, 0)  # consecutive failed pings
        self._errors: dict[str, str] = {}  # the last error of each target failing now
        self.down_since: datetime | None = None  # standing down since (None: may hold work)
        self.stand_downs = 0  # times this manager stood down
        self.pings_failed = 0  # failed pings, every target
        self._checking = asyncio.Lock()  # held by a check under way

    # -- what the manager reads ----------------------------------------------------------------

    def may_hold(self) -> bool:
        """Whether the manager may hold work: False once every pingable target failed
        ``failures`` pings in a row, until one answers."""
        return self.down_since is None

    @property
    def reason(self) -> str | None:
        """Why the manager stands down (one line), None while it may hold work."""
        if self.down_since is None:
            return None
        return f"every target fails its ping ({self._describe()}): holding no work"

    @property
    def failing(self) -> dict[str, str]:
        """The targets whose last ping failed, with the error."""
        return dict(self._errors)

    # -- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Ping on the clock's ticks of ``interval_s`` until cancelled."""
        if not self.targets:
            return  # nothing can be pinged: the manager always may hold work
        while True:
            await self.clock.sleep_until(next_tick(self.clock.now(), self.interval_s))
            await self.check()

    async def quiet(self) -> None:
        """Return once no check is under way (tests drive the pings with a virtual clock)."""
        async with self._checking:
            pass

    async def check(self) -> None:
        """Ping every target once (together, each bounded by :data:`PING_BOUND` of the
        interval) and update the verdict (public for tests)."""
        async with self._checking:
            self._count(await ping_each(self.targets, self.interval_s * PING_BOUND))
            self._judge()

    def _count(self, failed: Mapping[str, Exception]) -> None:
        for name in self.targets:
            exc = failed.get(name)
            if exc is not None:
                self.pings_failed += 1
                self._failed[name] += 1
                error = ping_error(exc, self.interval_s * PING_BOUND)
                if self._errors.get(name) != error:
                    log.warning("target %s: ping failed: %s", name, error)
                self._errors[name] = error
            else:
                if self._errors.pop(name, None) is not None:
                    log.info("target %s answers again", name)
                self._failed[name] = 0

    def _judge(self) -> None:
        down = all(n >= self.failures for n in self._failed.values())
        if down == (self.down_since is not None):
            return
        if down:
            self.down_since = self.clock.now()
            self.stand_downs += 1
            log.error(
                "every target failed %d pings in a row (%s): this manager stands down, hands "
                "over what it holds and takes no work until a target answers",
                self.failures,
                self._describe(),
            )
        else:
            self.down_since = None
            log.warning("a target answers again: this manager takes work again")
        if self._changed is not None:
            self._changed(not down)

    def _describe(self) -> str:
        return "; ".join(f"{n}: {e}" for n, e in sorted(self._errors.items()))
