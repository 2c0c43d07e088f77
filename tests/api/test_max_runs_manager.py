"""options.max_runs through real managers on a VirtualClock, PostgreSQL and SQLite: exactly N
scheduled slots reach the outbox, then none (a manual trigger does not count), with runs_left
and every preview stopping at the last run; a restart sends only the runs left; a takeover
(Redis Streams target, its claims flushed) never sends run N+1, even when the old leader died
before it recorded its last run."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import redis.asyncio as aioredis

from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import RunRecord
from periodic_manager.db.engine import create_engine
from periodic_manager.db.provider import DatabaseProvider
from periodic_manager.db.store import DatabaseRuntimeStore
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.runtime.timing import Timing
from periodic_manager.targets.redis.streams import RedisStreamsTarget
from tests.runtime.test_last_good import running
from tests.support import rawsql
from tests.support.e2e import T0, at, iso
from tests.support.managers import ManualLeader, settle

LIMITED = {"name": "thrice", "spec": "* * * * *", "task_type": "t", "options": {"max_runs": 3}}


async def test_a_real_manager_sends_max_runs_slots_then_none_and_triggers_do_not_count(
    db_url: str,
) -> None:
    async with running(db_url, T0) as rig:
        r = await rig.client.post("/schedules", json=LIMITED)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert r.json()["runs_left"] == 3 and r.json()["status"] == "active"
        assert r.json()["next_runs"] == [iso(at(12, m)) for m in (1, 2, 3)]
        t = await rig.client.post(f"/schedules/{sid}/trigger")
        assert t.status_code in (200, 201, 202), t.text
        await rig.advance_to(at(12, 1, 30))
        body = (await rig.client.get(f"/schedules/{sid}")).json()
        # Previews stop at the last run: two left, two slots shown (next_runs asks for three).
        assert body["runs_left"] == 2 and body["next_runs"] == [iso(at(12, 2)), iso(at(12, 3))]
        shown = (await rig.client.get(f"/views/schedules/{sid}/slots", params={"n": 10})).json()
        assert [s["at"] for s in shown["slots"]] == [iso(at(12, 2)), iso(at(12, 3))]
        await rig.advance_to(at(12, 6, 30))
        sent = [m for m in await rig.messages() if m["name"] == "thrice"]
        triggered = [m for m in sent if ":trigger:" in m["idempotency_key"]]
        assert len(triggered) == 1  # sent, and not one of the three
        assert [m["scheduled_at"] for m in sent if m not in triggered] == [
            iso(at(12, m)) for m in (1, 2, 3)
        ]
        entry = rig.manager.entry(sid)
        assert entry is not None and entry.next_slot is None and entry.last_error is None
        body = (await rig.client.get(f"/schedules/{sid}")).json()
        assert body["status"] == "ended" and body["runs_left"] == 0 and body["next_runs"] == []
        shown = (await rig.client.get(f"/views/schedules/{sid}/slots")).json()
        assert shown["slots"] == []
        [listed] = [
            i for i in (await rig.client.get("/views/schedules")).json()["items"] if i["id"] == sid
        ]
        assert listed["status"] == "ended"
        [held] = (await rig.client.get("/entries", params={"schedule_id": sid})).json()["items"]
        assert held["status"] == "ended" and held["next_slot"] is None  # as the manager holds it
        # Raising max_runs lets it go on where it stopped: two more runs, then none.
        p = await rig.client.patch(f"/schedules/{sid}", json={"options": {"max_runs": 5}})
        assert p.status_code == 200, p.text
        assert p.json()["runs_left"] == 2 and p.json()["status"] == "active"
        await rig.advance_to(at(12, 12, 30))
        assert (await rig.slots("thrice"))[1:] == [iso(at(12, m)) for m in (1, 2, 3, 7, 8)]


async def test_a_restart_sends_only_the_runs_left(db_url: str) -> None:
    async with running(db_url, T0) as rig:
        sid = (
            await rig.client.post("/schedules", json={**LIMITED, "options": {"max_runs": 4}})
        ).json()["id"]
        await rig.advance_to(at(12, 2, 30))
        assert await rig.slots("thrice") == [iso(at(12, 1)), iso(at(12, 2))]
    async with running(db_url, at(12, 2, 40)) as rig:  # a new process, a few seconds later
        assert (await rig.client.get(f"/schedules/{sid}")).json()["runs_left"] == 2
        await rig.advance_to(at(12, 9, 30))
        assert await rig.slots("thrice") == [iso(at(12, m)) for m in (1, 2, 3, 4)]
        assert (await rig.client.get(f"/schedules/{sid}")).json()["status"] == "ended"


class Forgetting(DatabaseRuntimeStore):
    """A store that loses every record of a slot from ``cutoff`` on: a leader that died after
    sending its last run and before recording it."""

    cutoff: datetime | None = None

    async def record_runs(self, runs: Sequence[RunRecord]) -> None:
        if self.cutoff is not None and any(r.slot >= self.cutoff for r in runs):
            raise OSError("the leader died before recording this")
        await super().record_runs(runs)


async def _takeover(
    db_url: str,
    redis_url: str,
    redis_prefix: str,
    *,
    max_runs: int,
    lost_from: datetime | None,
    dies_after: float,
    idle: float,
) -> list[str]:
    """@every 10s with ``max_runs``: a leader runs ``dies_after`` seconds and stops, the Redis
    claims are flushed, nobody leads for ``idle`` seconds, then the standby takes over. Every
    slot that reached the stream, in order."""
    # Created at T0 (as the API would stamp it): no slot of it went by unrecorded before.
    before = rawsql.instant(db_url, "2024-05-01 12:00:00.5")
    options = f"""'{{"max_runs": {max_runs}}}'"""
    await rawsql.insert(
        db_url, "limited", spec="'@every 10s'", options=options, effective_at=before
    )
    clock = VirtualClock(T0)
    engine = create_engine(db_url)
    client = aioredis.from_url(redis_url, decode_responses=True)
    managers: list[PeriodicTaskManager] = []

    def make(leader: bool, store: DatabaseRuntimeStore) -> PeriodicTaskManager:
        m = PeriodicTaskManager(
            DatabaseProvider(engine),
            RedisStreamsTarget(client, prefix=redis_prefix),
            clock=clock,
            store=store,
            timing=Timing(grace=30, sync_interval=3600),
            leadership=ManualLeader(leader),
        )
        managers.append(m)
        return m

    try:
        forgetting = Forgetting(engine)
        forgetting.cutoff = lost_from
        leader = make(True, forgetting)
        await leader.start()
        standby = make(False, DatabaseRuntimeStore(engine))
        await standby.start()
        await settle(clock, leader, standby)
        await clock.advance(dies_after, settle=lambda: leader.wait_settled(clock.now()))
        await leader.stop()
        for key in [k async for k in client.scan_iter(match=f"*{redis_prefix}*claim*")]:
            await client.delete(key)  # Redis forgot every claim
        await clock.advance(idle)
        await standby.leadership._set(True)  # type: ignore[attr-defined]
        await settle(clock, standby)
        await clock.advance(120, settle=lambda: standby.wait_settled(clock.now()))
        stream = f"{{{redis_prefix}:default}}:stream"
        return [f["scheduled_at"] for _, f in await client.xrange(stream) if f["name"] == "limited"]
    finally:
        for m in managers:
            await m.stop()
        await client.aclose()
        await engine.dispose()


def _slots(*seconds: int) -> list[str]:
    base = T0.replace(microsecond=0)
    return [iso(base + timedelta(seconds=s)) for s in seconds]


async def test_a_takeover_mid_way_sends_only_the_runs_left(
    db_url: str, redis_url: str, redis_prefix: str
) -> None:
    sent = await _takeover(
        db_url, redis_url, redis_prefix, max_runs=4, lost_from=None, dies_after=25, idle=20
    )
    # 12:00:10 and :20 by the leader; :30 and :40 (within grace) by the new leader; no more.
    assert sent == _slots(10, 20, 30, 40)


async def test_a_takeover_after_the_last_run_sends_nothing_even_with_the_claims_gone(
    db_url: str, redis_url: str, redis_prefix: str
) -> None:
    sent = await _takeover(
        db_url, redis_url, redis_prefix, max_runs=3, lost_from=None, dies_after=35, idle=5
    )
    assert sent == _slots(10, 20, 30)


async def test_a_run_sent_but_never_recorded_still_counts_at_a_takeover(
    db_url: str, redis_url: str, redis_prefix: str
) -> None:
    """The leader sent 12:00:30, its third and last run, and died before recording it; the
    claims are gone too. Within grace the new leader may send :30 again (the slot in flight,
    as any takeover after a broker lost its data); never :40, a fourth run."""
    lost = T0.replace(microsecond=0) + timedelta(seconds=30)
    sent = await _takeover(
        db_url, redis_url, redis_prefix, max_runs=3, lost_from=lost, dies_after=35, idle=5
    )
    assert sorted(set(sent)) == _slots(10, 20, 30) and len(sent) <= 4
    late = await _takeover_late(db_url, redis_url, redis_prefix)
    assert late == _slots(10, 20, 30)


async def _takeover_late(db_url: str, redis_url: str, redis_prefix: str) -> list[str]:
    """The same loss, the takeover a minute later (beyond grace): nothing more is sent."""
    await rawsql.execute(db_url, "DELETE FROM periodic_jobs")
    await rawsql.execute(db_url, "DELETE FROM pm_schedule_state")
    client = aioredis.from_url(redis_url, decode_responses=True)
    try:
        for key in [k async for k in client.scan_iter(match=f"*{redis_prefix}*")]:
            await client.delete(key)
    finally:
        await client.aclose()
    lost = T0.replace(microsecond=0) + timedelta(seconds=30)
    return await _takeover(
        db_url, redis_url, redis_prefix, max_runs=3, lost_from=lost, dies_after=35, idle=60
    )


async def test_a_leader_that_cannot_record_a_run_sends_no_further_slot_of_it(
    db_url: str, redis_url: str, redis_prefix: str
) -> None:
    """From 12:00:30 on nothing can be recorded: the leader sends :30, then skips :40, :50 and
    :60 (the run before is not recorded), so a manager that dies has at most one unrecorded
    run. The new leader counts that one as used and sends the two runs left: five in all."""
    lost = T0.replace(microsecond=0) + timedelta(seconds=30)
    sent = await _takeover(
        db_url, redis_url, redis_prefix, max_runs=5, lost_from=lost, dies_after=65, idle=60
    )
    assert sent == _slots(10, 20, 30, 100, 110)


async def test_a_max_runs_turned_bad_with_sql_is_a_row_error_and_the_old_count_holds(
    db_url: str,
) -> None:
    """The row turns bad (max_runs 'ten'): its last good version (max_runs 3) keeps running with
    its count, in this manager and in the next one, which restores it from the database."""
    async with running(db_url, T0) as rig:
        sid = (await rig.client.post("/schedules", json=LIMITED)).json()["id"]
        await rig.advance_to(at(12, 1, 30))
        bad = '{"max_runs": "ten"}'
        await rawsql.execute(db_url, f"UPDATE periodic_jobs SET options = '{bad}' WHERE id = {sid}")
        await rig.advance_to(at(12, 2, 30))
        assert await rig.slots("thrice") == [iso(at(12, 1)), iso(at(12, 2))]
        body = (await rig.client.get(f"/schedules/{sid}")).json()
        assert body["status"] == "error"
        [err] = [e for e in body["errors"] if e["source"] == "manager"]
        assert err["field"] == "options.max_runs" and err["last_good_since"] is not None
    async with running(db_url, at(12, 2, 40)) as rig:
        await rig.advance_to(at(12, 9, 30))
        assert await rig.slots("thrice") == [iso(at(12, m)) for m in (1, 2, 3)]
