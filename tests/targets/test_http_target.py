"""The http target against a real receiver (uvicorn on 127.0.0.1) and a real PostgreSQL: one
delivery per key, signed; retried with the same Idempotency-Key through an outage; permanent
answers dead at once, replayable; a dead manager's leases taken over; paced per host.

Time is a VirtualClock (backoffs, leases, Retry-After); the requests are real I/O, awaited with
short real pauses while virtual time stands still or moves.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import Task
from periodic_manager.db.engine import create_engine
from periodic_manager.db.http_deliveries import (
    DEAD,
    DONE,
    PENDING,
    DeadLetter,
    dead_letters,
    replay,
)
from periodic_manager.db.models import http_deliveries_table as table
from periodic_manager.schedules.instants import slot_text
from periodic_manager.targets.base import task_id_for
from periodic_manager.targets.http.addresses import private_address
from periodic_manager.targets.http.config import HttpConfig
from periodic_manager.targets.http.signing import verify
from periodic_manager.targets.http.target import HttpTarget
from tests.targets.http_receiver import Answer, Received, Receiver

START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
FAST = {"attempts": 200, "max_age": 86_400, "backoff": {"initial": 1, "max": 30}}


@pytest.fixture(autouse=True)
def _private_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    # The receiver is on 127.0.0.1: the write-time rule must allow it (the deliverer's config too).
    monkeypatch.setenv("PM_HTTP_ALLOW_PRIVATE", "true")
    monkeypatch.setenv("PM_HTTP_SECRET_HOOKS", "s3cret")


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver()
    await r.start()
    yield r
    await r.stop()


@pytest.fixture
async def engine(migrated_pg_url: str) -> AsyncIterator[AsyncEngine]:
    e = create_engine(migrated_pg_url)
    yield e
    await e.dispose()


def task(name: str, slot: datetime, url: str, **options: Any) -> Task:
    key = f"{name}:{slot_text(slot)}"
    return Task(
        id=task_id_for(key),
        name=name,
        task_type="reports.build",
        payload={"n": name},
        queue="default",
        options={"url": url, **options},
        idempotency_key=key,
        scheduled_at=slot,
        expires_at=slot + timedelta(seconds=30),
    )


class Delivering:
    """A target and its deliverer on a virtual clock, as a manager runs them."""

    def __init__(self, engine: AsyncEngine, clock: VirtualClock, owner: str, **config: Any):
        settings = {"allow_private": True, "lease_margin": 1.0, **config}
        self.target = HttpTarget(engine, HttpConfig(**settings))
        self.clock = clock
        self.task = asyncio.ensure_future(self.target.run_beside(clock, owner))

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def until(
    clock: VirtualClock, done: Callable[[], Any], step: float = 1.0, steps: int = 2000
) -> None:
    """Move virtual time by ``step`` until ``done()`` (awaited if need be) holds."""
    for _ in range(steps):
        found = done()
        if asyncio.iscoroutine(found):
            found = await found
        if found:
            return
        await asyncio.sleep(0.005)  # the requests' real I/O
        await clock.advance(step)
    raise AssertionError("not reached")


async def letters_of(engine: AsyncEngine) -> list[DeadLetter]:
    async with engine.connect() as conn:
        return await dead_letters(conn)


async def states(engine: AsyncEngine) -> dict[str, str]:
    async with engine.connect() as conn:
        rows = (await conn.execute(select(table.c.idempotency_key, table.c.state))).all()
    return {k: s for k, s in rows}


async def all_in(engine: AsyncEngine, state: str, count: int) -> bool:
    found = await states(engine)
    return len(found) == count and set(found.values()) == {state}


async def test_a_slot_is_one_delivery_whoever_sends_it(engine: AsyncEngine) -> None:
    one = HttpTarget(engine, HttpConfig(allow_private=True))
    two = HttpTarget(engine, HttpConfig(allow_private=True))  # another manager
    t = task("a.one", START, "http://127.0.0.1:9/x")
    first = await one.enqueue([t, t], START)
    again = await two.enqueue([t], START + timedelta(seconds=1))
    assert [r.status for r in first] == ["enqueued", "duplicate"]
    assert again[0].status == "duplicate" and again[0].message_id == first[0].message_id
    async with engine.connect() as conn:
        assert (await conn.execute(select(func.count()).select_from(table))).scalar() == 1


async def test_delivered_signed_with_the_key_and_the_slot(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    clock = VirtualClock(START)
    d = Delivering(engine, clock, "m1")
    t = task("a.signed", START, receiver.url, secret="hooks", headers={"X-Team": "ops"})
    [sent] = await d.target.enqueue([t], clock.now())
    await until(clock, lambda: all_in(engine, DONE, 1))
    await d.stop()
    [got] = receiver.requests
    assert got.method == "POST" and got.headers["idempotency-key"] == t.idempotency_key
    assert got.headers["x-pm-scheduled-at"] == "2026-01-05T09:00:00Z"
    assert got.headers["x-team"] == "ops" and got.headers["content-type"] == "application/json"
    assert json.loads(got.body) == {
        "schedule": "a.signed",
        "scheduled_at": "2026-01-05T09:00:00Z",
        "task_type": "reports.build",
        "payload": {"n": "a.signed"},
    }
    signature = got.headers["x-pm-signature"]
    signed_at = int(signature.split(",")[0][2:])
    assert verify(b"s3cret", signature, got.body, now=signed_at)
    assert not verify(b"wrong", signature, got.body, now=signed_at)
    assert await d.target.outcomes({}, [str(sent.message_id)]) == ["succeeded"]


async def test_retries_keep_the_key_until_a_2xx(engine: AsyncEngine, receiver: Receiver) -> None:
    answers = iter([(503, {}, b"busy"), (500, {}, b"oops")])
    receiver.answer = lambda r: next(answers, (200, {}, b"ok"))
    clock = VirtualClock(START)
    d = Delivering(engine, clock, "m1")
    t = task("a.retry", START, receiver.url, retry=FAST)
    await d.target.enqueue([t], clock.now())
    await until(clock, lambda: all_in(engine, DONE, 1))
    await d.stop()
    assert [r.headers["idempotency-key"] for r in receiver.requests] == [t.idempotency_key] * 3
    assert [r.headers["x-pm-attempt"] for r in receiver.requests] == ["1", "2", "3"]
    assert len({r.body for r in receiver.requests}) == 1
    assert receiver.processed == {t.idempotency_key: 1}
    assert d.target.delivery_counts() == {"done": 1, "retried": 2, "dead": 0}  # the metric's


async def test_retry_after_is_honoured(engine: AsyncEngine, receiver: Receiver) -> None:
    answers = iter([(429, {"Retry-After": "120"}, b"slow down")])
    receiver.answer = lambda r: next(answers, (200, {}, b"ok"))
    clock = VirtualClock(START)
    d = Delivering(engine, clock, "m1")
    await d.target.enqueue([task("a.later", START, receiver.url, retry=FAST)], clock.now())
    await until(clock, lambda: len(receiver.requests) == 1, step=0.5)
    first = clock.now()
    await until(clock, lambda: len(receiver.requests) == 2, step=5.0)
    await d.stop()
    assert (clock.now() - first).total_seconds() >= 115  # 120 s, less the 5 s steps


async def test_a_permanent_answer_is_a_dead_letter_at_once_and_replays_with_its_key(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    receiver.answer = lambda r: (422, {}, b"no such report")
    clock = VirtualClock(START)
    d = Delivering(engine, clock, "m1")
    t = task("a.dead", START, receiver.url, retry=FAST)
    [sent] = await d.target.enqueue([t], clock.now())
    await until(clock, lambda: all_in(engine, DEAD, 1))
    assert len(receiver.requests) == 1
    [letter] = await letters_of(engine)
    assert (letter.schedule, letter.idempotency_key) == ("a.dead", t.idempotency_key)
    assert (letter.last_status, letter.attempts) == (422, 1)
    assert letter.body_excerpt == "no such report" and letter.slot == START
    assert await d.target.outcomes({}, [str(sent.message_id)]) == ["failed"]
    receiver.answer = lambda r: (200, {}, b"ok")
    async with engine.connect() as conn:
        assert await replay(conn, clock.now(), ids=[letter.id]) == 1
    d.target.wake.set()
    await until(clock, lambda: all_in(engine, DONE, 1))
    await d.stop()
    assert [r.headers["idempotency-key"] for r in receiver.requests] == [t.idempotency_key] * 2
    assert receiver.processed == {t.idempotency_key: 1}


async def test_attempts_and_age_are_bounded(engine: AsyncEngine, receiver: Receiver) -> None:
    receiver.answer = lambda r: (500, {}, b"down")
    clock = VirtualClock(START)
    d = Delivering(engine, clock, "m1")
    few = {"attempts": 3, "backoff": {"initial": 1, "max": 2}}
    short = {"attempts": 100, "max_age": 10, "backoff": {"initial": 4, "max": 4}}
    await d.target.enqueue(
        [
            task("a.few", START, receiver.url, retry=few),
            task("a.short", START, receiver.url, retry=short),
        ],
        clock.now(),
    )
    await until(clock, lambda: all_in(engine, DEAD, 2))
    await d.stop()
    letters = {x.schedule: x for x in await letters_of(engine)}
    assert letters["a.few"].attempts == 3 and "gave up after 3" in str(letters["a.few"].last_error)
    assert letters["a.short"].attempts < 10 and "max_age" in str(letters["a.short"].last_error)


async def test_an_outage_of_ten_minutes_loses_nothing_and_doubles_nothing(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    clock = VirtualClock(START)
    d = Delivering(engine, clock, "m1")
    await receiver.stop()  # down: connections refused
    tasks = [
        task(f"o.s{i % 5}", START + timedelta(minutes=i // 5), receiver.url, retry=FAST)
        for i in range(40)
    ]
    for t in tasks:  # slots keep coming during the outage
        await d.target.enqueue([t], clock.now())
        await clock.advance(15)
    await until(clock, lambda: clock.now() >= START + timedelta(minutes=10), step=10)
    assert set((await states(engine)).values()) == {PENDING}
    await receiver.start()
    await until(clock, lambda: all_in(engine, DONE, 40), step=5)
    await d.stop()
    assert receiver.processed == {t.idempotency_key: 1 for t in tasks}


async def test_a_dead_managers_leases_are_taken_over(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    clock = VirtualClock(START)
    sender = HttpTarget(engine, HttpConfig(allow_private=True))
    tasks = [task(f"k.s{i}", START, receiver.url, timeout=2) for i in range(6)]
    await sender.enqueue(tasks, clock.now())
    # A manager claims them, and dies before recording anything (its requests may have left).
    claimed = await sender.store.claim("dead-one", clock.now(), 10, lambda r: timedelta(seconds=5))
    assert len(claimed) == 6
    d = Delivering(engine, clock, "m2")
    await clock.advance(4)
    await asyncio.sleep(0.05)
    assert receiver.requests == []  # still leased to the dead one
    await until(clock, lambda: all_in(engine, DONE, 6))
    await d.stop()
    assert receiver.processed == {t.idempotency_key: 1 for t in tasks}


async def test_one_host_is_paced(engine: AsyncEngine, receiver: Receiver) -> None:
    async def slow(r: Received) -> Answer:
        await asyncio.sleep(0.02)
        return 200, {}, b"ok"

    receiver.answer = slow
    clock = VirtualClock(START)
    d = Delivering(engine, clock, "m1", concurrency_per_host=4)
    tasks = [task(f"p.s{i}", START, receiver.url) for i in range(80)]
    await d.target.enqueue(tasks, clock.now())
    await until(clock, lambda: all_in(engine, DONE, 80), step=0.1)
    await d.stop()
    assert 1 < receiver.most_open <= 4
    assert len(receiver.processed) == 80


async def test_private_addresses_are_refused_when_sent(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    # This machine's own name resolves to one of its addresses: a name no literal check catches.
    name = socket.gethostname()
    addresses = {i[4][0] for i in socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)}
    if not addresses or not all(private_address(str(a)) for a in addresses):
        pytest.skip(f"{name} does not resolve to private addresses only here: {addresses}")
    clock = VirtualClock(START)
    d = Delivering(engine, clock, "m1", allow_private=False)
    by_name = task("s.private", START, f"http://{name}:{receiver.port}/hook")
    literal = task("s.literal", START, receiver.url)
    [queued, refused] = await d.target.enqueue([by_name, literal], clock.now())
    assert queued.status == "enqueued"
    assert refused.status == "failed" and refused.permanent and "127.0.0.1" in str(refused.error)
    await until(clock, lambda: all_in(engine, DEAD, 1))
    await d.stop()
    [letter] = await letters_of(engine)
    assert "PM_HTTP_ALLOW_PRIVATE" in str(letter.last_error) and "resolves to" in str(
        letter.last_error
    )
    assert receiver.requests == []


async def test_redirects_are_not_followed_and_answers_are_read_up_to_a_cap(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    receiver.answer = lambda r: (
        (302, {"Location": "http://127.0.0.1:9/elsewhere"}, b"")
        if r.path == "/hook"
        else (500, {}, b"x" * 1_000_000)
    )
    clock = VirtualClock(START)
    d = Delivering(engine, clock, "m1", max_response_bytes=4096)
    big = task("r.big", START, receiver.url.replace("/hook", "/big"), retry={"attempts": 1})
    await d.target.enqueue([task("r.moved", START, receiver.url), big], clock.now())
    await until(clock, lambda: all_in(engine, DEAD, 2))
    await d.stop()
    letters = {x.schedule: x for x in await letters_of(engine)}
    assert letters["r.moved"].last_status == 302
    assert "not followed" in str(letters["r.moved"].last_error)
    assert len(receiver.requests) == 2  # the redirect's target was never asked
    assert len(str(letters["r.big"].body_excerpt)) == 1000


async def test_done_deliveries_are_pruned_after_their_retention_dead_ones_stay(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    receiver.answer = lambda r: (
        (200, {}, b"ok") if "keep" in r.headers["idempotency-key"] else (410, {}, b"gone")
    )
    clock = VirtualClock(START)
    d = Delivering(engine, clock, "m1", done_retention=3600.0)
    sent = [task("keep.a", START, receiver.url), task("dead.a", START, receiver.url)]
    await d.target.enqueue(sent, clock.now())
    await until(clock, lambda: len(receiver.requests) == 2)
    await until(clock, lambda: states_are(engine, {"done", "dead"}))
    await clock.advance(3000)
    assert set((await states(engine)).values()) == {"done", "dead"}  # not an hour old yet
    await until(clock, lambda: states_are(engine, {"dead"}), step=60)  # pruned within 10 min
    await d.stop()
    assert len(await letters_of(engine)) == 1


async def states_are(engine: AsyncEngine, wanted: set[str]) -> bool:
    return set((await states(engine)).values()) == wanted


async def test_an_attempt_whose_outcome_is_not_written_before_its_lease_ends_is_not_sent_again(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    """The database refuses the write of an attempt's outcome until the row's lease has run
    out and the deliverer claimed the row again: the answered row is not sent a second time,
    and its outcome is written once the database takes it."""
    clock = VirtualClock(START)
    d = Delivering(engine, clock, "m1")
    store = d.target.store
    record = store.record
    refused_writes = 0

    async def failing_record(owner: str, outcomes: Any) -> None:
        nonlocal refused_writes
        if clock.now() < START + timedelta(seconds=120):
            refused_writes += 1
            raise OSError("database unreachable")
        await record(owner, outcomes)

    store.record = failing_record  # type: ignore[method-assign]
    try:
        t = task("w.s1", START, receiver.url)
        await d.target.enqueue([t], clock.now())
        await until(clock, lambda: receiver.processed.get(t.idempotency_key), step=0.5)
        await until(clock, lambda: all_in(engine, "done", 1), step=1.0)
    finally:
        await d.stop()
    assert refused_writes > 0
    assert receiver.answered_ok == {t.idempotency_key: 1}  # one request: not sent again
    assert len(receiver.requests) == 1


async def test_a_traced_slot_carries_its_traceparent_on_every_attempt(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    """With tracing on a task has a W3C traceparent: the request carries it as a header, the
    retry too (it is stored with the delivery, whichever manager sends it)."""
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    calls = 0

    def once_down(r: Received) -> Answer:
        nonlocal calls
        calls += 1
        return (503, {}, b"") if calls == 1 else (200, {}, b"ok")

    receiver.answer = once_down
    clock = VirtualClock(START)
    d = Delivering(engine, clock, "m1")
    try:
        t = task("t.s1", START, receiver.url, retry=FAST)
        t.traceparent = parent  # as the tracer stamps it (periodic_manager/tracing)
        await d.target.enqueue([t], clock.now())
        await until(clock, lambda: all_in(engine, "done", 1), step=1.0)
    finally:
        await d.stop()
    assert [r.headers.get("traceparent") for r in receiver.requests] == [parent, parent]
