"""Leader election on a real PostgreSQL and a real MariaDB: one leader, takeover on death,
cut-off and half-open."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from periodic_manager.clock import VirtualClock
from periodic_manager.runtime.leadership import LockLeadership
from tests.support import rawsql
from tests.support.faults import dsn
from tests.support.polling import eventually
from tests.support.tcpproxy import TcpProxy

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
async def clock() -> VirtualClock:
    return VirtualClock(T0)


async def polls_until(clock: VirtualClock, check: object, polls: int = 50) -> None:
    """Advance one leadership poll at a time until ``check()`` holds (bounded). The server ends a
    closed or killed session asynchronously, so one try may come before the lock is free; the
    standby simply tries again at its next poll, as it does in production."""
    for _ in range(polls):
        await clock.advance(1)
        if check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.1)  # the server side (session end) runs on real time
    raise AssertionError("condition not reached within the polls")


@pytest.fixture
async def pair(
    pg_url: str, clock: VirtualClock
) -> AsyncIterator[tuple[LockLeadership, LockLeadership]]:
    a = LockLeadership(dsn(pg_url), clock=clock, poll_interval=1.0, timeout=3.0)
    b = LockLeadership(dsn(pg_url), clock=clock, poll_interval=1.0, timeout=3.0)
    try:
        yield a, b
    finally:
        await a.stop()
        await b.stop()


async def test_one_leader_and_a_standby_that_takes_over_when_it_stops(
    pair, clock: VirtualClock
) -> None:
    a, b = pair
    changes: list[tuple[str, bool]] = []
    await a.start(lambda v: changes.append(("a", v)))
    await b.start(lambda v: changes.append(("b", v)))
    assert a.is_leader and not b.is_leader
    await clock.advance(1)
    assert a.is_leader and not b.is_leader  # checks do not flap
    await a.stop()
    await polls_until(clock, lambda: b.is_leader)  # the standby's next tries
    assert changes == [("a", True), ("a", False), ("b", True)]


async def test_leader_whose_session_is_killed_stops_and_the_standby_takes_over(
    pair, clock: VirtualClock, pg_url: str
) -> None:
    a, b = pair
    await a.start(lambda _v: None)
    await b.start(lambda _v: None)
    admin = await asyncpg.connect(dsn(pg_url))
    try:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'periodic_manager leader' AND datname = current_database()"
            " AND pid IN"
            " (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)"
        )
    finally:
        await admin.close()
    await polls_until(clock, lambda: not a.is_leader and b.is_leader)


async def test_cut_off_leader_stops_and_the_standby_takes_over(
    proxied: tuple[str, TcpProxy], pg_url: str, clock: VirtualClock
) -> None:
    url, proxy = proxied
    url = dsn(url)
    a = LockLeadership(url, clock=clock, poll_interval=1.0, timeout=3.0)  # through the proxy
    b = LockLeadership(dsn(pg_url), clock=clock, poll_interval=1.0, timeout=3.0)
    try:
        await a.start(lambda _v: None)
        await b.start(lambda _v: None)
        assert a.is_leader and not b.is_leader
        await proxy.cut()
        await polls_until(clock, lambda: not a.is_leader)
        await polls_until(clock, lambda: b.is_leader)
    finally:
        await a.stop()
        await b.stop()


async def test_half_open_leader_steps_down_before_the_server_frees_the_lock(
    proxied: tuple[str, TcpProxy], pg_url: str, clock: VirtualClock
) -> None:
    url, proxy = proxied
    url = dsn(url)
    a = LockLeadership(url, clock=clock, poll_interval=1.0, timeout=3.0)
    b = LockLeadership(dsn(pg_url), clock=clock, poll_interval=1.0, timeout=3.0)
    events: list[str] = []
    try:
        await a.start(lambda v: events.append(f"a:{v}"))
        await b.start(lambda v: events.append(f"b:{v}"))
        proxy.freeze()  # the leader's connection stays open but nothing gets through
        loop = asyncio.get_running_loop()
        frozen_at = loop.time()
        await clock.advance(1)  # the leader's check now hangs until its budget (2 s) runs out
        await eventually(lambda: not a.is_leader, "the frozen leader steps down", seconds=5)
        stepped_down = loop.time() - frozen_at
        # The server ends the silent session after idle_session_timeout (3 s); keep trying.
        for _ in range(100):
            if b.is_leader:
                break
            await clock.advance(1)
            await asyncio.sleep(0.1)
        took_over = loop.time() - frozen_at
        assert b.is_leader
        assert events == ["a:True", "a:False", "b:True"]  # never two leaders at once
        print(f"stepped down after {stepped_down:.2f} s, standby took over after {took_over:.2f} s")
        assert stepped_down < took_over < 6.0  # the old leader stopped before the lock was free
    finally:
        proxy.thaw()
        await a.stop()
        await b.stop()


# -- MariaDB/MySQL: the same loop on GET_LOCK ---------------------------------------------------


@pytest.fixture
async def mysql_proxied(mariadb_url: str) -> AsyncIterator[tuple[str, TcpProxy]]:
    """``mariadb_url``'s database through a TcpProxy the test can cut or freeze."""
    u = make_url(mariadb_url)
    proxy = TcpProxy(u.host or "127.0.0.1", u.port or 3306)
    port = await proxy.start()
    try:
        yield u.set(port=port).render_as_string(hide_password=False), proxy
    finally:
        await proxy.close()


async def test_mysql_one_leader_a_standby_that_takes_over_and_a_killed_session(
    mariadb_url: str, clock: VirtualClock
) -> None:
    a = LockLeadership(mariadb_url, clock=clock, poll_interval=1.0, timeout=3.0)
    b = LockLeadership(mariadb_url, clock=clock, poll_interval=1.0, timeout=3.0)
    elsewhere = (
        make_url(mariadb_url).set(database="another_db").render_as_string(hide_password=False)
    )
    other = LockLeadership(elsewhere, clock=clock)  # named locks are the server's: not shared
    assert other.lock.name != a.lock.name and len(a.lock.name) <= 64
    changes: list[tuple[str, bool]] = []
    try:
        await a.start(lambda v: changes.append(("a", v)))
        await b.start(lambda v: changes.append(("b", v)))
        assert a.is_leader and not b.is_leader
        await clock.advance(1)
        assert a.is_leader and not b.is_leader  # checks do not flap
        await a.stop()
        await polls_until(clock, lambda: b.is_leader)
        assert changes == [("a", True), ("a", False), ("b", True)]
        # The leader's session is killed: it steps down, and a new standby takes over.
        c = LockLeadership(mariadb_url, clock=clock, poll_interval=1.0, timeout=3.0)
        await c.start(lambda v: changes.append(("c", v)))
        assert not c.is_leader
        await rawsql.execute(mariadb_url, f"KILL {b._conn.thread_id()}")
        await polls_until(clock, lambda: not b.is_leader and c.is_leader)
        await c.stop()
    finally:
        await a.stop()
        await b.stop()


async def test_mysql_half_open_leader_steps_down_before_the_server_frees_the_lock(
    mysql_proxied: tuple[str, TcpProxy], mariadb_url: str, clock: VirtualClock
) -> None:
    url, proxy = mysql_proxied
    a = LockLeadership(url, clock=clock, poll_interval=1.0, timeout=3.0)  # through the proxy
    b = LockLeadership(mariadb_url, clock=clock, poll_interval=1.0, timeout=3.0)
    events: list[str] = []
    try:
        await a.start(lambda v: events.append(f"a:{v}"))
        await b.start(lambda v: events.append(f"b:{v}"))
        assert a.is_leader and not b.is_leader
        proxy.freeze()  # the leader's connection stays open but nothing gets through
        loop = asyncio.get_running_loop()
        frozen_at = loop.time()
        await clock.advance(1)  # the leader's check hangs until its budget (2 s) runs out
        await eventually(lambda: not a.is_leader, "the frozen leader steps down", seconds=5)
        stepped_down = loop.time() - frozen_at
        # The server ends the silent session after wait_timeout (3 s); keep trying.
        for _ in range(100):
            if b.is_leader:
                break
            await clock.advance(1)
            await asyncio.sleep(0.1)
        took_over = loop.time() - frozen_at
        assert b.is_leader
        assert events == ["a:True", "a:False", "b:True"]  # never two leaders at once
        assert stepped_down < took_over < 8.0  # the old leader stopped before the lock was free
    finally:
        proxy.thaw()
        await a.stop()
        await b.stop()
