"""Scheduler timing on a virtual clock with an in-memory target (no I/O, no wall-clock waits)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from periodic_manager.clock import VirtualClock
from periodic_manager.engine import entries
from periodic_manager.engine.dispatch import Hooks
from periodic_manager.engine.scheduler import Scheduler
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.targets.memory import MemoryTarget

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def cfg(name: str, spec: str, **kw: object) -> PeriodicTaskConfig:
    return PeriodicTaskConfig.create(name=name, spec=spec, task_type="demo.task", **kw)  # type: ignore[arg-type]


@pytest.fixture
async def rig() -> AsyncIterator[tuple[Scheduler, VirtualClock, MemoryTarget]]:
    clock = VirtualClock(T0)
    target = MemoryTarget()
    runs: list[object] = []

    async def on_runs(batch: object) -> None:
        runs.extend(batch)  # type: ignore[arg-type]

    sched = Scheduler(target, clock=clock, grace=30, on_runs=on_runs)
    sched.runs = runs  # type: ignore[attr-defined]
    task = asyncio.create_task(sched.run())
    await clock.settle()
    yield sched, clock, target
    sched.stop()
    await asyncio.wait_for(task, 5)


async def advance(sched: Scheduler, clock: VirtualClock, seconds: float) -> None:
    await clock.advance(seconds, settle=lambda: sched.wait_processed(clock.now()))


async def test_first_slot_is_strictly_after_registration(rig) -> None:
    sched, clock, target = rig
    clock.set(T0 + timedelta(seconds=10))  # exactly on an @every 10s slot
    entry = sched.register(cfg("a", "@every 10s"))
    assert entry.next_slot == T0 + timedelta(seconds=20)
    await advance(sched, clock, 0)
    assert target.messages == []


async def test_slots_become_tasks_with_keys_and_one_batch_per_instant(rig) -> None:
    sched, clock, target = rig
    sched.register(cfg("a", "@every 10s", payload={"n": 1}, options={"queue": "q1"}))
    sched.register(cfg("b", "@every 10s"))
    await advance(sched, clock, 25)
    assert target.slots("a") == [T0 + timedelta(seconds=10), T0 + timedelta(seconds=20)]
    assert [len(b) for b in target.batches] == [2, 2]
    task, enqueued_at = target.messages[0]
    assert task.idempotency_key == "a:2024-05-01T12:00:10Z"
    assert task.scheduled_at == T0 + timedelta(seconds=10)
    assert enqueued_at == T0 + timedelta(seconds=10)
    assert task.payload == {"n": 1} and task.queue == "q1" and task.task_type == "demo.task"
    assert task.expires_at == task.scheduled_at + timedelta(seconds=30)


async def test_register_wakes_a_sleeping_scheduler(rig) -> None:
    sched, clock, target = rig
    sched.register(cfg("hourly", "@every 1h"))
    await advance(sched, clock, 1)  # the loop now sleeps until 13:00
    sched.register(cfg("fast", "@every 5s"))
    await advance(sched, clock, 5)
    assert target.slots("fast") == [T0 + timedelta(seconds=5)]


async def test_unregister_stops_slots(rig) -> None:
    sched, clock, target = rig
    e = sched.register(cfg("a", "@every 10s"))
    await advance(sched, clock, 10)
    assert sched.unregister(e.key)
    await advance(sched, clock, 60)
    assert target.slots("a") == [T0 + timedelta(seconds=10)]


async def test_late_slot_beyond_grace_is_skipped_without_a_storm(rig) -> None:
    sched, clock, target = rig
    sched.register(cfg("a", "@every 10s"))
    await advance(sched, clock, 10)
    clock.set(T0 + timedelta(days=1, seconds=5))  # wall clock jumps a day forward
    await advance(sched, clock, 0)
    # Only the slots within grace (30 s) of now were enqueued; one skip for the rest.
    assert target.slots("a") == [T0 + timedelta(seconds=10)] + [
        T0 + timedelta(days=1, seconds=s) for s in (-20, -10, 0)
    ]
    skipped = [r for r in sched.runs if r.status == "skipped"]  # type: ignore[attr-defined]
    assert len(skipped) == 1 and skipped[0].slot == T0 + timedelta(seconds=20)


async def test_clock_stepping_back_never_enqueues_a_slot_twice(rig) -> None:
    sched, clock, target = rig
    sched.register(cfg("a", "@every 10s"))
    await advance(sched, clock, 30)
    clock.set(T0 + timedelta(seconds=5))  # back 25 s
    await advance(sched, clock, 40)
    slots = target.slots("a")
    assert len(slots) == len(set(slots))
    assert slots == [T0 + timedelta(seconds=s) for s in (10, 20, 30, 40)]


async def test_replaced_entry_starts_after_the_last_fired_slot(rig) -> None:
    sched, clock, target = rig
    old = sched.register(cfg("a", "@every 10s"))
    await advance(sched, clock, 10)
    clock.set(T0 + timedelta(seconds=2))  # clock back, then the schedule changes
    sched.unregister(old.key)
    new = sched.register(cfg("a", "@every 5s"))
    assert new.next_slot == T0 + timedelta(seconds=15)
    await advance(sched, clock, 20)
    assert target.slots("a") == [T0 + timedelta(seconds=s) for s in (10, 15, 20)]


async def test_target_outage_within_grace_is_retried_and_logged_once(
    rig, caplog: pytest.LogCaptureFixture
) -> None:
    sched, clock, target = rig
    errors: list[BaseException] = []
    sched.dispatcher.hooks = Hooks(on_error=lambda exc, tasks: errors.append(exc))
    sched.register(cfg("a", "@every 10s"))
    target.fail_with = "redis down"
    await advance(sched, clock, 20)  # slot 10 retried with backoff; slot 20 tried on time
    target.fail_with = None
    await advance(sched, clock, 5)  # the next attempts come within the capped backoff (5 s)
    # Each slot is retried on its own: slot 20 (first retry 0.2 s after it) is sent before
    # slot 10, whose backoff had grown.
    assert sorted(target.slots("a")) == [T0 + timedelta(seconds=10), T0 + timedelta(seconds=20)]
    assert errors == []  # nothing was given up
    assert len([r for r in caplog.records if "enqueue failed" in r.getMessage()]) == 1
    assert len([r for r in caplog.records if "recovered" in r.getMessage()]) == 1
    assert len(target.batches) == 2  # failed attempts never reached the target's state


async def test_target_outage_beyond_grace_fails_the_slot_and_the_schedule_goes_on(rig) -> None:
    sched, clock, target = rig
    errors: list[BaseException] = []
    sched.dispatcher.hooks = Hooks(on_error=lambda exc, tasks: errors.append(exc))
    sched.register(cfg("a", "@every 60s"))
    target.fail_with = "redis down"
    await advance(sched, clock, 100)  # slot 60 retried until 90 (grace 30), then failed
    target.fail_with = None
    await advance(sched, clock, 30)
    assert len(errors) == 1 and "redis down" in str(errors[0])
    assert target.slots("a") == [T0 + timedelta(seconds=120)]
    statuses = [(r.slot, r.status) for r in sched.runs]  # type: ignore[attr-defined]
    assert statuses == [
        (T0 + timedelta(seconds=60), "failed"),
        (T0 + timedelta(seconds=120), "enqueued"),
    ]
    # Backoff is capped and bounded: no busy loop while the target was down.
    assert sched.dispatcher.retry_max == 5.0


async def test_inactive_scheduler_sends_nothing_and_a_takeover_resumes_within_grace(rig) -> None:
    sched, clock, target = rig
    sched.register(cfg("a", "@every 10s"))
    sched.set_active(False)  # standby
    await advance(sched, clock, 45)
    assert target.slots("a") == []
    await sched.rebase(clock.now() - timedelta(seconds=30))
    sched.set_active(True)
    await advance(sched, clock, 0)
    # Slots within grace of the takeover (20, 30, 40) are sent; 10 is older than grace.
    assert target.slots("a") == [T0 + timedelta(seconds=s) for s in (20, 30, 40)]
    await advance(sched, clock, 10)
    assert target.slots("a")[-1] == T0 + timedelta(seconds=50)


async def test_a_rebase_of_many_entries_goes_in_turns(rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A takeover restarts every entry: with a million of them one pass would hold the event
    loop (and the leadership proof) for seconds."""
    sched, clock, _ = rig
    many = 1000
    for i in range(many):
        sched.register(cfg(f"s{i}", "@every 10s"))
    sched.set_active(False)
    done = [0]
    floor = entries.lookback_floor

    def counted(*args: Any) -> Any:
        done[0] += 1
        return floor(*args)

    monkeypatch.setattr(entries, "lookback_floor", counted)
    task = asyncio.ensure_future(sched.rebase(clock.now() - timedelta(seconds=30)))
    seen: set[int] = set()
    while not task.done():
        seen.add(done[0])
        await asyncio.sleep(0)
    await task
    assert done[0] == many and any(0 < n < many for n in seen)


async def test_an_entry_replaced_while_a_rebase_is_in_turns_looks_back_too(rig) -> None:
    """A sync may replace an entry between two turns of a takeover's rebase: the replacement
    is rebased like the others (its old entry, still in the rebase's list, is dead and passed
    over): it sends the slots the old leader may have missed within grace, and none at or before
    what the database records as settled (without, it resent those: duplicates once the broker
    forgot its claims)."""
    sched, clock, target = rig
    many = 2000
    configs = [cfg(f"s{i}", "@every 10s", schedule_id=i + 1) for i in range(many)]
    for config in configs:
        sched.register(config)
    sched.set_active(False)
    await advance(sched, clock, 45)
    settled = {c.ident: T0 + timedelta(seconds=30) for c in configs}  # the old leader sent 30
    task = asyncio.ensure_future(sched.rebase(clock.now() - timedelta(seconds=30), settled))
    await asyncio.sleep(0)  # the first turn ran; the last entries are not rebased yet
    assert not task.done()
    last = f"s{many - 1}"
    sched.register(cfg(last, "@every 10s", schedule_id=many, payload={"edited": True}))
    await task
    sched.set_active(True)
    await advance(sched, clock, 0)
    assert target.slots("s0") == [T0 + timedelta(seconds=40)]
    assert target.slots(last) == [T0 + timedelta(seconds=40)]


async def test_hooks_see_the_batch_before_and_the_results_after(rig) -> None:
    sched, clock, target = rig
    seen: list[str] = []

    async def post(results: object) -> None:
        seen.append(f"post:{[r.status for r in results]}")  # type: ignore[attr-defined]

    sched.dispatcher.hooks = Hooks(
        pre_enqueue=lambda tasks: seen.append(f"pre:{len(tasks)}"), post_enqueue=post
    )
    sched.register(cfg("a", "@every 10s"))
    await advance(sched, clock, 10)
    assert seen == ["pre:1", "post:['enqueued']"]


async def test_two_identical_configs_with_different_rows_are_two_entries(rig) -> None:
    sched, clock, target = rig
    a = sched.register(cfg("same", "@every 10s", schedule_id=1))
    b = sched.register(cfg("same", "@every 10s", schedule_id=2))
    assert a.entry_id != b.entry_id and len(sched) == 2


async def test_tasks_failed_one_by_one_are_retried_alone_within_grace(rig) -> None:
    sched, clock, target = rig
    from periodic_manager.contracts import EnqueueResult

    real = target.enqueue
    calls: list[list[str]] = []

    async def flaky(tasks, now):  # "b" fails twice, as one target of a routing target would
        calls.append([t.name for t in tasks])
        if len(calls) <= 2:
            ok = await real([t for t in tasks if t.name != "b"], now)
            return [
                EnqueueResult(t, "failed", None, error="celery down")
                if t.name == "b"
                else ok.pop(0)
                for t in tasks
            ]
        return await real(tasks, now)

    target.enqueue = flaky  # type: ignore[method-assign]
    sched.register(cfg("a", "@every 10s"))
    sched.register(cfg("b", "@every 10s"))
    await advance(sched, clock, 11)
    assert calls == [["a", "b"], ["b"], ["b"]]  # only the failed task was sent again
    assert target.slots("a") == target.slots("b") == [T0 + timedelta(seconds=10)]
    statuses = sorted((r.name, r.status) for r in sched.runs)  # type: ignore[attr-defined]
    assert statuses == [("a", "enqueued"), ("b", "enqueued")]


async def test_stop_before_the_loop_first_runs_is_not_forgotten() -> None:
    """stop() right after the loop was spawned (before its first step) used to be reset by the
    loop's start, and a manager stopping right after start() hung ~30 s."""
    sched = Scheduler(MemoryTarget(), clock=VirtualClock(T0))
    task = asyncio.create_task(sched.run())
    sched.stop()
    await asyncio.wait_for(task, 1)  # returns at once (virtual clock: no sleep would ever end)


async def test_a_manager_stopped_right_after_start_stops_at_once() -> None:
    from periodic_manager.providers import StaticProvider
    from periodic_manager.runtime.manager import PeriodicTaskManager

    clock = VirtualClock(T0)
    mgr = PeriodicTaskManager(StaticProvider([cfg("a", "@every 10s")]), MemoryTarget(), clock=clock)
    await mgr.start()
    await asyncio.wait_for(mgr.stop(), 1)


async def test_wait_idle_returns_when_the_scheduler_stops_during_a_dispatch() -> None:
    """Background writers wait between dispatches; a dispatch stuck in a hung target must not
    keep them (and a shutdown's last publication) waiting once the scheduler stops."""
    sched = Scheduler(MemoryTarget(), clock=VirtualClock(T0))
    sched._idle.clear()  # a dispatch under way that never ends
    waiter = asyncio.ensure_future(sched.wait_idle())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done()
    sched.stop()
    await asyncio.wait_for(waiter, 5)


async def test_a_fence_stops_sending_for_its_entries_at_once_a_staged_batch_included(rig) -> None:
    """Partitions lost: their entries are fenced off before the pass that unregisters them."""
    sched, clock, target = rig
    a = sched.register(cfg("a", "@every 10s"))
    sched.register(cfg("b", "@every 10s"))
    await advance(sched, clock, 9.99)  # the batch of 10 s is staged (both entries in it)
    assert sched._stager.staged is not None and len(sched._stager.staged.entries) == 2
    sched.fence(lambda ident: ident == a.ident)
    await advance(sched, clock, 0.01)
    assert target.slots("a") == [] and target.slots("b") == [T0 + timedelta(seconds=10)]
    await advance(sched, clock, 10)
    assert target.slots("a") == []  # still fenced: never sent
    sched.unregister(a.key)
    sched.fence(None)
    await advance(sched, clock, 10)
    assert target.slots("a") == [] and len(target.slots("b")) == 3


async def test_a_takeover_registering_its_entries_rebased_files_them_as_register_then_rebase_did() -> (
    None
):
    """A takeover of partitions registers its entries inside ``resuming()``: each one that the
    takeover keeps (new here, or replacing an entry) is filed already rebased (one slot
    computed, not two; one path, ``Entries._rebase``), at exactly the slot, lower bound and runs
    left that registering and then ``rebase_some`` give; a code-registered one and a limited one
    without its count are left to ``rebase_some``, as before."""
    clock = VirtualClock(T0 + timedelta(minutes=5))
    after = clock.now() - timedelta(seconds=30)
    now = clock.now()
    recent = now - timedelta(seconds=12)  # effective within grace: nothing before it is sent
    configs = [
        cfg("plain", "@every 10s", schedule_id=1),
        cfg("settled", "@every 10s", schedule_id=2),
        cfg("settled-later", "*/1 * * * *", schedule_id=3),
        cfg("jittered", "@every 20s", schedule_id=4, options={"jitter": 15}),
        cfg("limited", "@every 10s", schedule_id=5, options={"max_runs": 40}),
        cfg("recent", "@every 7s", schedule_id=6, effective_at=recent),
        cfg("code", "@every 10s"),  # no row: registered from code, not the takeover's
        cfg("not-kept", "@every 10s", schedule_id=7),
    ]
    settled = {
        2: now - timedelta(seconds=15),
        3: now - timedelta(seconds=1),
        5: now - timedelta(seconds=25),
    }
    counted = {5: (12, now - timedelta(seconds=25))}

    def keep(ident: int | str) -> bool:
        return isinstance(ident, int) and ident != 7

    def built() -> Scheduler:
        sched = Scheduler(MemoryTarget(), clock=clock, grace=30)
        sched.set_active(False)
        return sched

    replaced = cfg("replaced", "@every 13s", schedule_id=8)  # held before, replaced during
    configs.append(cfg("replaced", "@every 10s", schedule_id=8))
    before = built()  # registered, then rebased
    before.register(replaced, synced=True, now=now)
    some = [before.register(c, synced=True, now=now, counted=counted.get(c.ident)) for c in configs]
    await before.rebase_some([e for e in some if keep(e.ident)], after, settled, counted)
    resumed = built()
    resumed.register(replaced, synced=True, now=now)
    with resumed.resuming(after, settled, keep) as rebased:
        for c in configs:
            resumed.register(c, synced=True, now=now, counted=counted.get(c.ident))
    assert rebased == {1, 2, 3, 4, 5, 6, 8}
    for c in configs:
        if not keep(c.ident):
            continue
        a, b = before.get(c.ident), resumed.get(c.ident)
        assert a is not None and b is not None
        assert (b.next_slot, b.after, b.runs_left) == (a.next_slot, a.after, a.runs_left), c.name
    for table in ("timetable", "sends"):
        a_t, b_t = getattr(before.registered, table), getattr(resumed.registered, table)
        assert b_t.next_instant() == a_t.next_instant()
    # Outside the takeover's idents, nothing changes: filed as registered (after now).
    assert resumed.get(configs[6].ident).next_slot == now + timedelta(seconds=10)  # type: ignore[union-attr]
    assert resumed.get(7).next_slot == now + timedelta(seconds=10)  # type: ignore[union-attr]
    # A limited entry registered without its count is left to rebase_some.
    other = built()
    with other.resuming(after, settled, keep) as rebased:
        other.register(configs[4], synced=True, now=now)
    assert rebased == set()


async def test_a_hung_read_of_runs_left_holds_back_no_send() -> None:
    """The store's count of runs left (options.max_runs) is read before a send; a read that
    never answers (a hung database) is given up after its bound and the slot goes out, for the
    limited schedule (by its own count) and for every other one due with it."""
    clock = VirtualClock(T0)
    target = MemoryTarget()
    asked: list[list[str]] = []

    async def hung(keys: object) -> dict[str, Any]:
        asked.append(list(keys))  # type: ignore[call-overload]
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    sched = Scheduler(target, clock=clock, grace=30, read_state=hung)
    sched.decisions.recount_bound = 0.05
    task = asyncio.create_task(sched.run())
    try:
        await clock.settle()
        sched.register(cfg("limited", "@every 10s", options={"max_runs": 3}))
        sched.register(cfg("plain", "@every 10s"))
        await asyncio.wait_for(advance(sched, clock, 10), 5)
        assert asked, "the runs left were not read"
        sent = sorted((t.idempotency_key, at) for t, at in target.messages)
        slot = T0 + timedelta(seconds=10)
        assert [(k.split(":")[0], at) for k, at in sent] == [("limited", slot), ("plain", slot)]
    finally:
        sched.stop()
        await asyncio.wait_for(task, 5)
