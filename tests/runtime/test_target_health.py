"""The verdict of a manager's target pings (runtime/target_health.py): it stands down after
``failures`` failed pings in a row of every target, not before, not for some targets only, and
takes work again at the first answer."""

from __future__ import annotations

from datetime import UTC, datetime

from periodic_manager.clock import VirtualClock
from periodic_manager.errors import TargetError
from periodic_manager.runtime.target_health import TargetHealth
from periodic_manager.targets.memory import MemoryTarget
from periodic_manager.targets.routing import RoutingTarget

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


class Broker(MemoryTarget):
    """A target whose broker answers its pings while ``up``."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.up = True

    async def ping(self) -> None:
        if not self.up:
            raise TargetError(f"{self.name}: connection refused")


async def test_it_stands_down_after_the_stated_failures_of_every_target_and_not_before() -> None:
    redis, arq = Broker("redis"), Broker("arq")
    changes: list[bool] = []
    health = TargetHealth(
        RoutingTarget({"redis": redis, "arq": arq}, default="redis"),
        clock=VirtualClock(T0),
        interval_s=2,
        failures=3,
        changed=changes.append,
    )
    redis.up = False
    for _ in range(5):  # one target down: the schedules of the other go on here
        await health.check()
    assert health.may_hold() and health.reason is None and changes == []
    assert set(health.failing) == {"redis"}
    arq.up = False
    await health.check()
    await health.check()
    assert health.may_hold()  # arq failed twice only
    await health.check()
    assert not health.may_hold() and changes == [False] and health.stand_downs == 1
    assert health.reason is not None and "arq: " in health.reason and "redis: " in health.reason
    await health.check()
    assert changes == [False]  # said once
    arq.up = True
    await health.check()  # the first answer of any target ends it
    assert health.may_hold() and health.reason is None and changes == [False, True]
    assert set(health.failing) == {"redis"}


async def test_a_failure_between_answers_starts_the_count_again() -> None:
    redis = Broker("redis")
    health = TargetHealth(redis, clock=VirtualClock(T0), interval_s=2, failures=3)
    for up in (False, False, True, False, False, True, False, False):
        redis.up = up
        await health.check()
        assert health.may_hold()
    assert health.pings_failed == 6


async def test_a_target_that_cannot_be_pinged_never_stands_a_manager_down() -> None:
    health = TargetHealth(MemoryTarget(), clock=VirtualClock(T0), interval_s=2, failures=1)
    await health.run()  # nothing to ping: returns at once
    assert health.may_hold()
