"""Partitions with real manager processes (PM_COORDINATION=partitions) sending 600 schedules of
``@every 1s`` to a Redis stream: three managers share the partitions, one is SIGKILLed, one
stopped with SIGTERM, one joins, and one is cut off from PostgreSQL through a proxy while it still
reaches Redis; the audit counts every (schedule, slot) on the stream.

The one place real time passes: real processes on the wall clock. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import redis.asyncio as aioredis

from periodic_manager.db.migrate import upgrade
from periodic_manager.schedules.partition import partition_of
from tests.support.faults import (
    assert_exactly_once,
    dsn,
    expected_slots,
    insert_schedules,
    stream_keys,
)
from tests.support.polling import eventually
from tests.support.servers import ManagerProcess, free_port
from tests.support.tcpproxy import TcpProxy

SCHEDULES = 600
N = 64
TTL = 3  # PM_LEASE_TTL: a killed manager's partitions are free after at most this


async def holdings(url: str) -> dict[int, list[int]]:
    """pid -> the partitions whose unexpired lease names that manager; -1: partitions held by
    nobody (or by an expired lease)."""
    conn = await asyncpg.connect(dsn(url))
    try:
        rows = await conn.fetch(
            "SELECT p.partition, m.pid FROM pm_partitions p LEFT JOIN pm_managers m"
            " ON m.manager_id = p.holder AND p.expires_at > now()"
        )
    finally:
        await conn.close()
    out: dict[int, list[int]] = {}
    for r in rows:
        out.setdefault(r["pid"] if r["pid"] is not None else -1, []).append(r["partition"])
    return out


async def registered(url: str, managers: list[ManagerProcess]) -> bool:
    """Whether each of ``managers`` counts, in its heartbeat row, exactly the schedules of the
    partitions its unexpired leases name: its takeovers have registered them (and its hand-overs
    dropped the others). The heartbeat is written at once after a takeover registered."""
    conn = await asyncpg.connect(dsn(url))
    try:
        ids = [r["id"] for r in await conn.fetch("SELECT id FROM periodic_jobs")]
        beats = await conn.fetch("SELECT pid, entry_count FROM pm_managers")
    finally:
        await conn.close()
    counted = {r["pid"]: r["entry_count"] for r in beats}
    held = await holdings(url)
    return all(
        m.pid in held
        and counted.get(m.pid) == sum(1 for i in ids if partition_of(i, N) in held[m.pid])
        for m in managers
    )


def most_held(log: str) -> int:
    """The most partitions a manager held at once, from its "took" lines (it registers the
    schedules of those alone)."""
    return max((int(n) for n in re.findall(r"\((\d+) held of", log)), default=0)


def saw_everyone(log: str, managers: int) -> bool:
    """Whether a manager's first take counted all ``managers`` (live or coming): one whose
    first round came before another manager even registered (an interpreter started a moment
    later on a busy machine) could not know of it."""
    first = re.search(r"held of \d+, (\d+) live, (\d+) coming\)", log)
    return first is not None and int(first[1]) + int(first[2]) >= managers


def started_fairly(managers: list[ManagerProcess]) -> bool:
    """Managers started together each took only their share: none that found every other one
    registered ever held (and registered the schedules of) more, nor had anything to hand over.
    The exceptions are inherent: a manager whose first round came before any other manager
    registered was alone then, and took everything at once (as a lone manager must); one whose
    first round came before the last of them registered took the share of those it saw."""
    share = -(-N // len(managers))
    alone = [m for m in managers if "(64 held of 64, 1 live, 0 coming)" in m.log()]
    return len(alone) <= 1 and all(
        most_held(m.log()) <= share and "handed over" not in m.log()
        for m in managers
        if m not in alone and saw_everyone(m.log(), len(managers))
    )


def shared_by(held: dict[int, list[int]], managers: list[ManagerProcess]) -> bool:
    """Every partition held by one of ``managers``, none above the fair share."""
    pids = {m.pid for m in managers}
    share = -(-N // len(managers))
    return (
        set(held) == pids
        and sum(len(p) for p in held.values()) == N
        and all(len(p) <= share for p in held.values())
    )


async def test_three_processes_kill_leave_join_and_cut_off_every_slot_once(
    pg_url: str,
    proxied: tuple[str, TcpProxy],
    redis_client: aioredis.Redis,
    redis_prefix: str,
    redis_url: str,
    tmp_path: Any,
) -> None:
    await upgrade(pg_url)
    await insert_schedules(pg_url, [(f"q{i:03d}", "@every 1s", {}) for i in range(SCHEDULES)])
    env = {
        "PM_DATABASE_URL": pg_url,
        "PM_TARGET": "redis",
        "PM_REDIS_URL": redis_url,
        "PM_STREAM_PREFIX": redis_prefix,
        "PM_COORDINATION": "partitions",
        "PM_LEASE_TTL": str(TTL),
        "PM_HEARTBEAT_INTERVAL": "1",
        "PM_SYNC_INTERVAL": "30",
    }
    cut_url, proxy = proxied  # c reaches PostgreSQL through it (and Redis directly)
    procs = {
        name: ManagerProcess(
            env | ({"PM_DATABASE_URL": cut_url} if name == "c" else {}), tmp_path / f"{name}.log"
        )
        for name in "abcd"
    }
    a, b, c, d = procs.values()

    def logs() -> str:
        return "\n".join(f"--- {n}\n{p.log()[-2000:]}" for n, p in procs.items())

    async def shared(managers: list[ManagerProcess], what: str, seconds: float) -> float:
        started = time.monotonic()

        async def check() -> bool:
            return shared_by(await holdings(pg_url), managers)

        await eventually(check, what, seconds=seconds, interval=0.1, detail=logs)
        return time.monotonic() - started

    async def taken(managers: list[ManagerProcess], what: str) -> float:
        started = time.monotonic()
        await eventually(
            lambda: registered(pg_url, managers), what, seconds=30, interval=0.1, detail=logs
        )
        return time.monotonic() - started

    try:
        began = datetime.now(UTC)
        for p in (a, b, c):
            p.start()
        # Three interpreters start at once (seconds of CPU each on a busy 2-core machine): how
        # soon they share is bounded by the poll, and printed, not asserted (no product bound).
        start_s = await shared([a, b, c], "three managers share every partition", 60)
        assert started_fairly([a, b, c]), logs()
        await eventually(lambda: a.alive() and b.alive() and c.alive(), "all run", seconds=1)
        # A lease is taken before the entries of its schedules are registered, and a partition
        # no manager held before starts as a first start does: its entries' first slots are
        # after their registration, none before (no look back for it). Managers that started
        # together took only such partitions, and on a busy machine a takeover can register
        # after the next slot: the audit starts once each one registered its share.
        reg_s = await taken([a, b, c], "the three managers registered their shares")
        first = datetime.now(UTC)  # from here every slot must be sent once
        await asyncio.sleep(3)  # the processes send on the wall clock meanwhile

        a.kill()
        kill_s = await shared([b, c], "the killed manager's partitions are held again", TTL + 5)
        await asyncio.sleep(2)  # taken at once (liveness locks): the survivors send meanwhile

        assert b.stop() == 0, logs()  # a graceful leave: handed over at once
        leave_s = await shared([c], "the leaving manager's partitions are held again", 5)

        d.start()
        # Its interpreter's start (seconds of CPU on a busy machine) is no part of the join.
        await eventually(lambda: "started with" in d.log(), "d started", seconds=60, detail=logs)
        join_s = await shared([c, d], "a joining manager takes its share", 15)
        await asyncio.sleep(2)
        await proxy.cut()  # c still reaches Redis: it stops sending before its leases can expire
        cut_s = await shared([d], "the cut-off manager's partitions are held again", TTL + 5)
        await taken([d], "the cut-off manager's partitions are registered again")
        # At least 2 s more, and an audit of 12 s at least: takeovers now take well under a
        # second, and a quick run's window was shorter than the 10 slots the audit asks for.
        await asyncio.sleep(
            max(2.0, (first + timedelta(seconds=12) - datetime.now(UTC)).total_seconds())
        )
        last = datetime.now(UTC) - timedelta(seconds=1)  # slots up to here were due while held
        # d holds every partition: it sends every slot up to ``last`` (late on a busy machine,
        # within grace) before it leaves; a slot it never sends is missing from the audit.
        names = [f"q{i:03d}" for i in range(SCHEDULES)]
        expected = [k for name in names for k in expected_slots(name, "@every 1s", first, last)]

        async def sent() -> bool:
            counts = await stream_keys(redis_client, redis_prefix)
            return all(k in counts for k in expected)

        with contextlib.suppress(AssertionError):  # the audit below says what is missing
            await eventually(sent, "every slot up to the last sent", seconds=10, interval=0.5)
        assert d.stop() == 0, logs()
        # Its lease connection ended (reset by the proxy): with it its liveness lock, so it stopped
        # at once (a half-open one: when its trust ended).
        assert "sending for them stops" in c.log(), logs()
    finally:
        for p in procs.values():
            p.kill()
    counts = await stream_keys(redis_client, redis_prefix)
    assert len(expected) >= SCHEDULES * 10
    assert_exactly_once(counts, expected)  # also: no key anywhere on the stream twice
    # Nothing from before the managers started: no look back for partitions never held.
    assert min(datetime.fromisoformat(k.split(":", 1)[1]) for k in counts) > began - timedelta(
        seconds=1
    )
    print(
        f"shared by 3 in {start_s:.1f} s, registered {reg_s:.1f} s later; after SIGKILL held again "
        f"in {kill_s:.1f} s (TTL {TTL} s); "
        f"after SIGTERM in {leave_s:.1f} s; join shared in {join_s:.1f} s; cut off, held again in "
        f"{cut_s:.1f} s; {len(expected)} slots audited"
    )
    assert kill_s < TTL + 5 and cut_s < TTL + 5  # the leases' TTL, and 5 s to notice and take


def slots_of(port: int, status: str) -> float:
    """The manager's ``periodic_manager_slots_total`` of ``status``, summed over queues."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("periodic_manager_slots_total{") and f'status="{status}"' in line
    )


async def test_a_manager_frozen_past_its_lease_ttl_sends_nothing_for_what_it_lost(
    pg_url: str, redis_client: aioredis.Redis, redis_prefix: str, redis_url: str, tmp_path: Any
) -> None:
    """SIGSTOP a manager for longer than the lease TTL, then SIGCONT it: the other manager took
    its partitions once the database let the leases expire, and the resumed one sends nothing
    for them (its overdue slots included) before it gets a share back by a clean hand-over.
    Which of its timers runs first after SIGCONT is up to the event loop; the order where the
    send comes first is pinned down under a virtual clock in test_partition_moves.py (leases
    expiring under load)."""
    schedules = 200
    await upgrade(pg_url)
    await insert_schedules(pg_url, [(f"z{i:03d}", "@every 1s", {}) for i in range(schedules)])
    env = {
        "PM_DATABASE_URL": pg_url,
        "PM_TARGET": "redis",
        "PM_REDIS_URL": redis_url,
        "PM_STREAM_PREFIX": redis_prefix,
        "PM_COORDINATION": "partitions",
        "PM_LEASE_TTL": str(TTL),
        "PM_HEARTBEAT_INTERVAL": "1",
        "PM_SYNC_INTERVAL": "30",
    }
    port = free_port()
    a = ManagerProcess(env | {"PM_METRICS_PORT": str(port)}, tmp_path / "a.log")
    b = ManagerProcess(env, tmp_path / "b.log")

    def logs() -> str:
        return f"--- a\n{a.log()[-3000:]}\n--- b\n{b.log()[-3000:]}"

    async def shared(managers: list[ManagerProcess], what: str, seconds: float) -> None:
        async def check() -> bool:
            return shared_by(await holdings(pg_url), managers)

        await eventually(check, what, seconds=seconds, interval=0.1, detail=logs)

    try:
        a.start()
        b.start()
        await shared([a, b], "two managers share every partition", 15)
        assert started_fairly([a, b]), logs()
        first = datetime.now(UTC)
        await asyncio.sleep(2)
        assert slots_of(port, "enqueued") > 0 and slots_of(port, "duplicate") == 0, logs()
        os.kill(a.pid, signal.SIGSTOP)  # frozen: no renewal, no send, its leases run out
        try:
            await shared([b], "the frozen manager's partitions are held again", TTL + 5)
            await asyncio.sleep(1)
        finally:
            os.kill(a.pid, signal.SIGCONT)
        # Resumed: its slots due while frozen are overdue, its trust long over.
        await shared([a, b], "the resumed manager gets its share back", 15)
        await asyncio.sleep(2)
        last = datetime.now(UTC) - timedelta(seconds=1)
        # b sent every slot of those partitions meanwhile: a send by a would meet b's claim.
        assert slots_of(port, "duplicate") == 0, logs()
        # Which check stops it first is up to the event loop after SIGCONT: its trust ran out
        # (no renewal in time), its lease connection ended with its liveness lock, or its wall
        # clock is seen to have jumped. Each one says so, and each one stops its sending.
        assert re.search(r"sending (for them )?stops", a.log()), logs()
        assert a.stop() == 0 and b.stop() == 0, logs()
    finally:
        a.kill()
        b.kill()
    counts = await stream_keys(redis_client, redis_prefix)
    expected = [
        k for i in range(schedules) for k in expected_slots(f"z{i:03d}", "@every 1s", first, last)
    ]
    assert_exactly_once(counts, expected)


async def test_a_manager_alone_holds_every_partition_when_it_reports_started(
    pg_url: str, redis_prefix: str, redis_url: str, tmp_path: Any
) -> None:
    """Alone (no other manager registered), a manager takes every partition at its first round,
    before its "started with" line: it does not wait for peers that are not there, and that line
    counts every schedule (the rows of the partitions taken are read before it, as a leader's
    first sync is: operators and benches time a start by it)."""
    await upgrade(pg_url)
    await insert_schedules(pg_url, [(f"l{i:02d}", "@every 1s", {}) for i in range(50)])
    env = {
        "PM_DATABASE_URL": pg_url,
        "PM_TARGET": "redis",
        "PM_REDIS_URL": redis_url,
        "PM_STREAM_PREFIX": redis_prefix,
        "PM_COORDINATION": "partitions",
        "PM_LEASE_TTL": "30",
        "PM_SYNC_INTERVAL": "30",
    }
    a = ManagerProcess(env, tmp_path / "a.log")
    try:
        a.start()
        await eventually(lambda: "started with" in a.log(), "a started", seconds=30, detail=a.log)
        held = await holdings(pg_url)
        assert sorted(held.get(a.pid, [])) == list(range(N)), a.log()
        took = a.log().split("started with")[0]
        assert "(64 held of 64, 1 live, 0 coming)" in took, a.log()
        assert "started with 50 entries" in a.log(), a.log()
        assert a.stop() == 0, a.log()
    finally:
        a.kill()


async def test_a_sigkilled_manager_is_taken_over_within_seconds_not_at_the_lease_ttl(
    pg_url: str, redis_client: aioredis.Redis, redis_prefix: str, redis_url: str, tmp_path: Any
) -> None:
    """Two managers at the default lease TTL (15 s); one is SIGKILLed. Its session ends with the
    process, and with it its liveness lock: the survivor holds every partition within seconds
    (the goal is 2 s; asserted with a margin for a slow machine, far below the TTL), and every
    slot is sent once, the killed one's last ones included."""
    schedules, ttl = 200, 15
    await upgrade(pg_url)
    await insert_schedules(pg_url, [(f"k{i:03d}", "@every 1s", {}) for i in range(schedules)])
    env = {
        "PM_DATABASE_URL": pg_url,
        "PM_TARGET": "redis",
        "PM_REDIS_URL": redis_url,
        "PM_STREAM_PREFIX": redis_prefix,
        "PM_COORDINATION": "partitions",
        "PM_LEASE_TTL": str(ttl),
        "PM_HEARTBEAT_INTERVAL": "1",
        "PM_SYNC_INTERVAL": "30",
    }
    a = ManagerProcess(env, tmp_path / "a.log")
    b = ManagerProcess(env, tmp_path / "b.log")

    def logs() -> str:
        return f"--- a\n{a.log()[-3000:]}\n--- b\n{b.log()[-3000:]}"

    async def shared(managers: list[ManagerProcess]) -> bool:
        return shared_by(await holdings(pg_url), managers)

    try:
        a.start()
        b.start()
        await eventually(lambda: shared([a, b]), "two managers share", seconds=60, detail=logs)
        await eventually(
            lambda: registered(pg_url, [a, b]), "both registered", seconds=30, detail=logs
        )
        first = datetime.now(UTC)
        await asyncio.sleep(2)
        killed = time.monotonic()
        a.kill()
        await eventually(
            lambda: shared([b]), "b holds every partition", seconds=ttl, interval=0.05, detail=logs
        )
        taken_s = time.monotonic() - killed
        await eventually(
            lambda: registered(pg_url, [b]), "b registered them", seconds=30, detail=logs
        )
        await asyncio.sleep(2)
        last = datetime.now(UTC) - timedelta(seconds=1)
        names = [f"k{i:03d}" for i in range(schedules)]
        expected = [k for name in names for k in expected_slots(name, "@every 1s", first, last)]

        async def sent() -> bool:
            counts = await stream_keys(redis_client, redis_prefix)
            return all(k in counts for k in expected)

        with contextlib.suppress(AssertionError):  # the audit below says what is missing
            await eventually(sent, "every slot up to the last sent", seconds=10, interval=0.5)
        assert b.stop() == 0, logs()
    finally:
        a.kill()
        b.kill()
    assert_exactly_once(await stream_keys(redis_client, redis_prefix), expected)
    print(f"after SIGKILL every partition held again in {taken_s:.2f} s (lease TTL {ttl} s)")
    assert taken_s < 5, logs()  # the goal (2 s) with a margin; the TTL would be 15 s
