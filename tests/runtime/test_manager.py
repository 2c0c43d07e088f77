"""Manager sync semantics with a static provider, a memory store and target, on a virtual clock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import ChangeSet, ProviderSnapshot, RowError, StoredVersion
from periodic_manager.engine.entry import ScheduledEntry
from periodic_manager.errors import NotFoundError, ProviderError
from periodic_manager.providers import StaticProvider
from periodic_manager.runtime import leading, publishing
from periodic_manager.runtime.last_good import LastGoodKeeper
from periodic_manager.runtime.leadership import AlwaysLeader
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.runtime.memory_store import MemoryRuntimeStore
from periodic_manager.runtime.publishing import SLICE, EntryPublisher
from periodic_manager.runtime.timing import Timing
from periodic_manager.schedules.definition import PeriodicTaskConfig, ident_of
from periodic_manager.targets.memory import MemoryTarget

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def row(i: int, name: str, spec: str = "@every 10s", **kw: object) -> PeriodicTaskConfig:
    return PeriodicTaskConfig.create(name=name, spec=spec, task_type="t", schedule_id=i, **kw)  # type: ignore[arg-type]


class FlakyProvider(StaticProvider):
    down = False

    async def get_configs(self) -> ProviderSnapshot:
        if self.down:
            raise ProviderError("connection refused")
        return await super().get_configs()


@pytest.fixture
async def rig() -> AsyncIterator[
    tuple[PeriodicTaskManager, FlakyProvider, VirtualClock, MemoryTarget, MemoryRuntimeStore]
]:
    clock = VirtualClock(T0)
    provider = FlakyProvider([row(1, "a")])
    target = MemoryTarget()
    store = MemoryRuntimeStore()
    mgr = PeriodicTaskManager(
        provider, target, clock=clock, store=store, timing=Timing(sync_interval=30, grace=30)
    )
    await mgr.start()
    yield mgr, provider, clock, target, store
    await mgr.stop()


async def advance(mgr: PeriodicTaskManager, clock: VirtualClock, seconds: float) -> None:
    await clock.advance(seconds, settle=lambda: mgr.wait_settled(clock.now()))


async def test_first_sync_runs_before_the_scheduler_starts(rig) -> None:
    mgr, _, clock, target, store = rig
    assert [e.config.name for e in mgr.entries()] == ["a"]
    await mgr.flush()
    assert list(store.entries[mgr.manager_id].values())[0].name == "a"
    await advance(mgr, clock, 10)
    assert target.slots("a") == [T0 + timedelta(seconds=10)]


async def test_added_changed_removed_rows_are_picked_up_at_the_next_sync(rig) -> None:
    mgr, provider, clock, target, store = rig
    provider.configs = [row(1, "a", "@every 5s"), row(2, "b")]
    await advance(mgr, clock, 10)  # not yet synced: old timing
    assert target.slots("a") == [T0 + timedelta(seconds=10)] and target.slots("b") == []
    await advance(mgr, clock, 20)  # sync at T0+30 (the sync interval)
    await advance(mgr, clock, 10)
    assert target.slots("a")[-2:] == [T0 + timedelta(seconds=35), T0 + timedelta(seconds=40)]
    assert target.slots("b") == [T0 + timedelta(seconds=40)]
    provider.configs = [row(2, "b")]
    await advance(mgr, clock, 20)  # sync at T0+60
    n = len(target.slots("a"))
    await advance(mgr, clock, 30)
    assert len(target.slots("a")) == n
    assert {e.name for e in store.entries[mgr.manager_id].values()} == {"b"}


async def test_unchanged_hash_keeps_the_entry_and_its_timing(rig) -> None:
    mgr, provider, clock, _, _ = rig
    before = mgr.entries()[0]
    provider.configs = [row(1, "a")]  # equal content, new object
    report = await mgr.sync()
    assert report.unchanged == 1 and not report.added and not report.replaced
    assert mgr.entries()[0] is before


async def test_changed_hash_replaces_and_entry_ids_are_stable(rig) -> None:
    mgr, provider, clock, _, _ = rig
    first_id = mgr.entries()[0].entry_id
    provider.configs = [row(1, "a", payload={"v": 2})]
    report = await mgr.sync()
    assert report.replaced and mgr.entries()[0].entry_id != first_id
    other = PeriodicTaskManager(provider, MemoryTarget(), clock=clock)
    await other.sync()
    assert other.entries()[0].entry_id == mgr.entries()[0].entry_id  # same row + hash -> same id


async def test_provider_failure_keeps_every_entry(rig, caplog: pytest.LogCaptureFixture) -> None:
    mgr, provider, clock, target, _ = rig
    provider.down = True
    caplog.set_level(logging.ERROR)
    for _ in range(3):
        report = await mgr.sync()
        assert not report.ok
    assert (
        len([r for r in caplog.records if "sync failed" in r.getMessage()]) == 1
    )  # once per outage
    await advance(mgr, clock, 20)
    assert len(target.slots("a")) == 2
    assert mgr.last_sync_error and "connection refused" in mgr.last_sync_error
    provider.down = False
    assert (await mgr.sync()).ok and mgr.last_sync_error is None


async def test_bad_row_is_logged_once_per_content_and_published(
    rig, caplog: pytest.LogCaptureFixture
) -> None:
    mgr, provider, clock, target, store = rig
    caplog.set_level(logging.ERROR)
    provider.errors = [RowError(7, "bad", "h1", "spec", "minute: out-of-range")]
    await mgr.sync()
    await mgr.sync()
    provider.errors = [RowError(7, "bad", "h2", "timezone", "unknown zone")]
    await mgr.sync()
    await mgr.flush()  # publishing to the store runs beside the sync
    logged = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert len(logged) == 2
    published = [e for e in store.entries[mgr.manager_id].values() if e.status == "error"]
    assert [(e.schedule_key, e.last_error) for e in published] == [("7", "timezone: unknown zone")]
    provider.errors = []
    await mgr.sync()
    await mgr.flush()
    assert all(e.status == "active" for e in store.entries[mgr.manager_id].values())
    await advance(mgr, clock, 10)
    assert target.slots("a") == [T0 + timedelta(seconds=10)]  # the good row kept firing


async def test_register_from_code_survives_syncs(rig) -> None:
    mgr, provider, clock, target, _ = rig
    mgr.register(PeriodicTaskConfig.create(name="code", spec="@every 10s", task_type="t"))
    await mgr.sync()
    await advance(mgr, clock, 10)
    assert target.slots("code") == [T0 + timedelta(seconds=10)]
    mgr.unregister("code")
    with pytest.raises(NotFoundError):
        mgr.unregister("code")


async def test_request_sync_wakes_the_sync_loop(rig) -> None:
    mgr, provider, clock, target, _ = rig
    provider.configs = [row(1, "a"), row(2, "b")]
    mgr.request_sync()
    await advance(mgr, clock, 10)
    assert target.slots("b") == [T0 + timedelta(seconds=10)]


async def test_stop_unpublishes_the_manager(rig) -> None:
    mgr, _, _, _, store = rig
    assert mgr.manager_id in store.managers
    await mgr.stop()
    assert mgr.manager_id not in store.managers
    await mgr.start()  # the fixture stops it again


async def test_stop_returns_when_a_driver_turns_cancellation_into_an_error() -> None:
    """asyncpg/SQLAlchemy may raise their own error when a query is cancelled; the publisher
    loop must still end, or stop() would wait forever (seen with 100,000 entries)."""

    class SwallowingStore(MemoryRuntimeStore):
        async def apply_entries(self, *args: object) -> None:
            try:
                await asyncio.Event().wait()  # a write that never finishes by itself
            except asyncio.CancelledError:
                raise RuntimeError("driver error raised on cancel") from None

    clock = VirtualClock(T0)
    mgr = PeriodicTaskManager(
        StaticProvider([row(1, "a")]), MemoryTarget(), clock=clock, store=SwallowingStore()
    )
    await mgr.start()
    await clock.settle()
    await asyncio.wait_for(mgr.stop(), 10)
    assert mgr.scheduler.entries()  # it stopped; nothing else to wait for


async def test_flush_waits_for_a_write_already_under_way() -> None:
    """flush() called while the background write is still making canonical payloads (before it
    reaches the store) returns only once every entry queued before it is in the store."""
    store = MemoryRuntimeStore()
    publisher = EntryPublisher(store, "m1", on_failure=lambda exc: None)
    for i in range(1, 3 * SLICE + 1):
        publisher.upsert(ScheduledEntry.of(row(i, f"job{i}"), T0, synced=True))
    first = asyncio.create_task(publisher.flush())
    await asyncio.sleep(0)  # the first write has taken the queue and yielded while it works
    assert not publisher._entries  # it holds them, nothing is queued for the second flush
    await publisher.flush()
    assert len(store.entries["m1"]) == 3 * SLICE
    await first


async def test_publishing_removes_ids_unless_written_again_in_the_same_write() -> None:
    """Within one write, an entry id removed and then written again stays, other removals go."""
    store = MemoryRuntimeStore()
    publisher = EntryPublisher(store, "m1", on_failure=lambda exc: None)
    a = ScheduledEntry.of(row(1, "a"), T0, synced=True)
    b = ScheduledEntry.of(row(2, "b"), T0, synced=True)
    publisher.upsert(a)
    publisher.upsert(b)
    await publisher.flush()
    assert set(store.entries["m1"]) == {a.entry_id, b.entry_id}
    publisher.remove(a.entry_id)
    publisher.remove(b.entry_id)
    again = ScheduledEntry.of(row(1, "a"), T0 + timedelta(seconds=5), synced=True)
    assert again.entry_id == a.entry_id  # same row, same content: the same id
    publisher.upsert(again)
    await publisher.flush()
    assert set(store.entries["m1"]) == {a.entry_id}
    assert store.entries["m1"][a.entry_id].registered_at == T0 + timedelta(seconds=5)


async def test_publishing_waits_between_slices_while_a_dispatch_is_under_way() -> None:
    """A large write goes slice by slice, and each slice first awaits ``between`` (the manager
    passes the scheduler's wait for no dispatch under way): a slot due meanwhile goes first."""
    store = MemoryRuntimeStore()
    idle = asyncio.Event()
    idle.set()
    publisher = EntryPublisher(store, "m1", on_failure=lambda exc: None, between=idle.wait)
    for i in range(1, 3 * SLICE + 1):
        publisher.upsert(ScheduledEntry.of(row(i, f"job{i}"), T0, synced=True))
    writes: list[int] = []
    apply = store.apply_entries

    async def counted(manager_id: str, upserts: list, removed: list) -> None:  # type: ignore[type-arg]
        writes.append(len(upserts))
        if len(writes) == 1:
            idle.clear()  # a dispatch starts while the first slice is written
        await apply(manager_id, upserts, removed)

    store.apply_entries = counted  # type: ignore[method-assign]
    write = asyncio.create_task(publisher.flush())
    for _ in range(50):
        await asyncio.sleep(0)
    assert writes == [SLICE] and not write.done()  # the next slice waits for the dispatch
    idle.set()
    await write
    assert writes == [SLICE, SLICE, SLICE] and len(store.entries["m1"]) == 3 * SLICE


# -- long passes share the event loop (pacing.in_turns) ------------------------------------------

MANY = 1000  # several turns of in_turns (its first slice is 256 items)


async def seen_during(coro: Any, count: Callable[[], int]) -> set[int]:
    """The values of ``count()`` another task sees while ``coro`` runs: a pass that never lets
    the event loop run shows only its value before and after."""
    task = asyncio.ensure_future(coro)
    seen: set[int] = set()
    while not task.done():
        seen.add(count())
        await asyncio.sleep(0)
    await task
    seen.add(count())
    return seen


def midway(seen: set[int]) -> bool:
    return any(0 < n < MANY for n in seen)


async def test_a_cold_start_publishes_its_entries_only_once_started() -> None:
    """The background publisher waits for start() to finish: a leadership that takes a while to
    start (round trips to the database) is not slowed by the publishing of every entry."""
    up = [False]
    written_before_up: list[int] = []

    class Store(MemoryRuntimeStore):
        async def apply_entries(
            self, manager_id: str, upserts: Sequence[Any], removed: Sequence[str]
        ) -> None:
            if not up[0]:
                written_before_up.append(len(upserts))
            await super().apply_entries(manager_id, upserts, removed)

    class SlowLeader(AlwaysLeader):
        async def start(self, on_change: Any) -> None:
            for _ in range(50):  # round trips: the event loop runs other tasks meanwhile
                await asyncio.sleep(0)
            await super().start(on_change)

    clock = VirtualClock(T0)
    store = Store()
    mgr = PeriodicTaskManager(
        StaticProvider([row(i, f"j{i}") for i in range(1, 11)]),
        MemoryTarget(),
        clock=clock,
        store=store,
        leadership=SlowLeader(),
    )
    await mgr.start()
    up[0] = True
    try:
        for _ in range(100):
            if len(store.entries.get(mgr.manager_id, {})) == 10:
                break
            await asyncio.sleep(0)
        assert len(store.entries[mgr.manager_id]) == 10  # published in the background
        assert written_before_up == []
    finally:
        await mgr.stop()


async def test_publishing_builds_its_records_in_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write's records are built in turns even when the store answers at once (in memory):
    publishing a cold start's entries never holds the event loop for the whole slice."""
    built = [0]
    real = publishing.entry_record

    def counted(entry: Any, view: Any = None) -> Any:
        built[0] += 1
        return real(entry, view)

    monkeypatch.setattr(publishing, "entry_record", counted)
    store = MemoryRuntimeStore()
    publisher = EntryPublisher(store, "m1", on_failure=lambda exc: None)
    assert SLICE >= MANY  # one slice: only turns inside it can let the others run
    for i in range(1, MANY + 1):
        publisher.upsert(ScheduledEntry.of(row(i, f"job{i}"), T0, synced=True))
    assert midway(await seen_during(publisher.flush(), lambda: built[0]))
    assert len(store.entries["m1"]) == MANY


async def test_removals_and_row_errors_of_a_change_set_go_in_turns() -> None:
    clock = VirtualClock(T0)
    mgr = PeriodicTaskManager(
        StaticProvider([row(i, f"j{i}") for i in range(1, MANY + 1)]), MemoryTarget(), clock=clock
    )
    await mgr.start()
    try:
        reconciler = mgr.syncer.reconciler
        removed = ChangeSet(revision=1, removed=[str(i) for i in range(1, MANY + 1)])
        assert midway(
            await seen_during(
                reconciler.apply_changes(removed, T0), lambda: MANY - len(mgr.scheduler)
            )
        )
        bad = [RowError(i, f"j{i}", f"h{i}", "spec", "bad", revision=2) for i in range(1, MANY + 1)]
        errors = ChangeSet(revision=2, errors=bad)
        assert midway(
            await seen_during(
                reconciler.apply_changes(errors, T0), lambda: len(reconciler.row_errors)
            )
        )
        # A full sync without them removes their error records in turns too.
        snapshot = ProviderSnapshot(configs=[], errors=[], revision=3)
        assert midway(
            await seen_during(
                reconciler.apply_snapshot(snapshot, T0), lambda: MANY - len(reconciler.row_errors)
            )
        )
    finally:
        await mgr.stop()


async def test_restoring_last_good_versions_goes_in_turns() -> None:
    clock = VirtualClock(T0)
    mgr = PeriodicTaskManager(StaticProvider(), MemoryTarget(), clock=clock)

    class Store:
        async def load_last_good(self, keys: Sequence[str]) -> list[StoredVersion]:
            return [StoredVersion(k, (), T0, 1) for k in keys]

    configs = {str(i): row(i, f"j{i}") for i in range(1, MANY + 1)}
    keeper = LastGoodKeeper(
        mgr.scheduler,
        mgr.publisher,
        "m1",
        store=Store(),  # type: ignore[arg-type]
        judge=lambda raw: configs[str(raw[0])],
    )
    bad = {k: RowError(int(k), f"j{k}", "h", "spec", "bad", revision=1) for k in configs}
    restore = keeper._restore(list(configs), bad, T0)
    assert midway(await seen_during(restore, lambda: len(mgr.scheduler)))
    assert len(mgr.scheduler) == MANY


async def test_reading_the_settled_slots_of_a_takeover_goes_in_turns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Store(MemoryRuntimeStore):
        async def settled_after(self, since: datetime) -> dict[str, datetime]:
            return {str(i): T0 for i in range(1, MANY + 1)}

    clock = VirtualClock(T0)
    mgr = PeriodicTaskManager(StaticProvider(), MemoryTarget(), clock=clock, store=Store())
    calls = [0]

    def counted(key: str) -> int | str:
        calls[0] += 1
        return ident_of(key)

    monkeypatch.setattr(leading, "ident_of", counted)
    read = await seen_during(mgr.leading._settled_after(mgr.leading._terms), lambda: calls[0])
    assert midway(read)


async def test_a_schedule_created_after_the_last_sync_starts_at_its_creation_not_its_registration(
    rig,
) -> None:
    """The API previews a new schedule's slots from its creation; a sync that registers it a
    little later still sends the slots since then (within grace), and only those. At the first
    sync, a row created seconds before the start fires nothing old (nothing fires at start)."""
    mgr, provider, clock, target, _ = rig
    keys = lambda name: sorted(t.idempotency_key for t, _ in target.messages if t.name == name)  # noqa: E731
    created = clock.now() + timedelta(seconds=0.5)
    await advance(mgr, clock, 0.5)
    provider.configs.append(row(2, "new", "@every 1s", effective_at=created))
    await advance(mgr, clock, 2.7)  # the row is seen by a sync only now
    await mgr.sync()
    await advance(mgr, clock, 1)
    # Slots since its creation: 12:00:01, :02, :03 (late, within grace), then :04 on time.
    assert keys("new") == [f"new:2024-05-01T12:00:0{s}Z" for s in (1, 2, 3, 4)]
    # A row already older than the previous read is not new: it starts at its registration.
    provider.configs.append(row(3, "old", "@every 1s", effective_at=T0 - timedelta(days=1)))
    await mgr.sync()
    await advance(mgr, clock, 1.2)
    assert keys("old") == ["old:2024-05-01T12:00:05Z"]


async def test_the_first_sync_sends_nothing_from_before_the_start() -> None:
    clock = VirtualClock(T0)
    target = MemoryTarget()
    provider = StaticProvider(
        [row(1, "fresh", "@every 1s", effective_at=T0 - timedelta(seconds=5))]
    )
    mgr = PeriodicTaskManager(provider, target, clock=clock, timing=Timing(grace=30))
    await mgr.start()
    try:
        await advance(mgr, clock, 1.5)
    finally:
        await mgr.stop()
    assert [t.idempotency_key for t, _ in target.messages] == ["fresh:2024-05-01T12:00:01Z"]


async def test_dropping_the_entries_of_lost_partitions_goes_in_turns() -> None:
    clock = VirtualClock(T0)
    mgr = PeriodicTaskManager(
        StaticProvider([row(i, f"j{i}") for i in range(1, MANY + 1)]), MemoryTarget(), clock=clock
    )
    await mgr.start()
    try:
        reconciler = mgr.syncer.reconciler
        gone = lambda ident: isinstance(ident, int)  # noqa: E731
        assert midway(await seen_during(reconciler.drop(gone), lambda: MANY - len(mgr.scheduler)))
        assert len(mgr.scheduler) == 0
    finally:
        await mgr.stop()


async def test_a_loop_that_dies_sets_the_event_its_health_watcher_waits_on() -> None:
    # The manager command waits on it (besides a look every few seconds), so a dead loop ends
    # the process at once, without a wake-up every second at rest.
    from periodic_manager.runtime.tasks import Supervisor

    tasks = Supervisor(lambda: True)

    async def dies() -> None:
        raise RuntimeError("boom")

    tasks.spawn(asyncio.sleep(3600), "sleeper")
    assert not tasks.died.is_set()
    tasks.spawn(dies(), "dier")
    await asyncio.wait_for(tasks.died.wait(), 5)
    assert tasks.failed_task == "periodic-manager-dier" and isinstance(tasks.failed, RuntimeError)
    await tasks.stop()
