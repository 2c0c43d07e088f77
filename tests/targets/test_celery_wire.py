"""The Celery messages the manager writes to Redis itself, against what ``app.send_task`` writes.

The same tasks are enqueued twice on the test Redis: once by a target writing messages directly,
once by a target publishing with kombu (``send_task``). Every key both wrote is read back with
LRANGE/SMEMBERS and compared byte for byte, after replacing only the values that legitimately
differ between two publishes (a random delivery tag, the publishing thread's reply-to id, and the
absolute ``expires`` instant, which send_task computes from the wall clock). So the format cannot
drift from Celery's without a failing test.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis
from celery import Celery
from celery.utils.saferepr import saferepr
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu import Exchange, Queue

from periodic_manager.clock import SystemClock
from periodic_manager.contracts import Task
from periodic_manager.targets.base import task_id_for
from periodic_manager.targets.celery.target import CeleryTarget
from periodic_manager.targets.celery.wire import Layout, Routes, fast_saferepr

TAG = re.compile(r'"delivery_tag": "[0-9a-f-]{36}"')
REPLY = re.compile(r'"reply_to": "[0-9a-f-]{36}"')
EXPIRES = re.compile(r'"expires": "([0-9T:.+-]+)"')
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def task(prefix: str, slot: datetime, name: str, **fields: Any) -> Task:
    key = f"{prefix}.{name}:{slot.isoformat()}"
    values: dict[str, Any] = {
        "id": task_id_for(key),
        "name": f"{prefix}.{name}",
        "task_type": "pmtest.record",
        "payload": {"a": 1},
        "queue": "default",
        "options": {},
        "idempotency_key": key,
        "scheduled_at": slot,
        "expires_at": slot + timedelta(seconds=30),
    }
    values.update(fields)
    values["queue"] = values["options"].get("queue", "default")  # as a schedule's config has it
    return Task(**values)


def cases(prefix: str, slot: datetime) -> list[Task]:
    """One task per feature of the format (payload shapes, routing, priorities, limits)."""
    q = f"{prefix}.q"
    return [
        task(prefix, slot, "kwargs", payload={"é": 'it\'s "x"', "n": [1, 2.5, None, True]}),
        task(prefix, slot, "args", payload=[1, "two", None], options={"queue": q}),
        task(prefix, slot, "scalar", payload="x", options={"queue": q}),
        task(prefix, slot, "null", payload=None, options={"queue": q}),
        task(prefix, slot, "deep", payload={"a": {"b": {"c": {"d": [1]}}}, "s": "\\"}),
        task(prefix, slot, "long", payload={"s": "word " * 400}),
        task(prefix, slot, "prio3", options={"queue": q, "extra": {"priority": 3}}),
        task(prefix, slot, "prio9", options={"queue": q, "extra": {"priority": 200}}),
        task(
            prefix,
            slot,
            "limits",
            options={"queue": q, "timeout": 7, "extra": {"soft_time_limit": 5, "expires": 3600}},
        ),
        task(
            prefix,
            slot,
            "exchange",
            options={"queue": q, "extra": {"exchange": q, "routing_key": q}},
        ),
        # PM_OTEL: the W3C trace context as one more header, where send_task merges it.
        task(prefix, slot, "traced", traceparent=TRACEPARENT),
    ]


async def dump(client: aioredis.Redis, keyprefix: str) -> dict[str, Any]:
    """Every kombu key under ``keyprefix``: lists as their raw messages, sets as sorted members."""
    out: dict[str, Any] = {}
    async for key in client.scan_iter(match=f"{keyprefix}*", count=1000):
        short = key[len(keyprefix) :]
        kind = await client.type(key)
        if kind == "list":
            out[short] = await client.lrange(key, 0, -1)
        elif kind == "set":
            out[short] = sorted(await client.smembers(key))
    return out


def normalised(raw: str) -> tuple[str, str | None]:
    """``raw`` with the tag, reply-to and expires instant replaced; and that instant."""
    found = EXPIRES.search(raw)
    text = TAG.sub('"delivery_tag": "<tag>"', REPLY.sub('"reply_to": "<reply>"', raw))
    return EXPIRES.sub('"expires": "<instant>"', text), found.group(1) if found else None


@pytest.fixture
async def pair(
    redis_client: aioredis.Redis, redis_prefix: str, redis_url: str
) -> AsyncIterator[Any]:
    """Make (direct target, kombu target) for some Celery settings; each writes under its own
    kombu key prefix and claims under its own prefix."""
    made: list[CeleryTarget] = []

    def make(
        transport: dict[str, Any] | None = None, **conf: Any
    ) -> tuple[CeleryTarget, CeleryTarget]:
        out = []
        for fast in (True, False):
            name = f"{redis_prefix}{'w' if fast else 'k'}"
            options = {**(transport or {}), "global_keyprefix": f"{name}:"}
            config = {**conf, "broker_transport_options": options}
            target = CeleryTarget.from_url(redis_url, prefix=name, config=config, fast_path=fast)
            made.append(target)
            out.append(target)
        assert out[0].fast_path_off is None and out[1].fast_path_off is not None
        return out[0], out[1]

    try:
        yield make
    finally:
        for target in made:
            await target.close()


@pytest.mark.parametrize(
    "transport",
    [None, {"sep": ":", "priority_steps": list(range(10))}],
    ids=["kombu-defaults", "custom-sep-and-steps"],
)
async def test_written_messages_are_byte_for_byte_what_send_task_writes(
    pair: Any, redis_client: aioredis.Redis, redis_prefix: str, transport: dict[str, Any] | None
) -> None:
    direct, kombu = pair(transport)
    now = SystemClock().now()  # send_task computes `expires` from the wall clock
    slot = now.replace(microsecond=0)
    tasks = cases(redis_prefix, slot)
    for target in (direct, kombu):
        results = await target.enqueue(tasks, now)
        assert [r.status for r in results] == ["enqueued"] * len(tasks), [r.error for r in results]
    written = await dump(redis_client, f"{redis_prefix}w:")
    published = await dump(redis_client, f"{redis_prefix}k:")
    assert written.keys() == published.keys()
    # A list per queue and priority step, and the bindings kombu declares.
    assert {k for k in written if k.startswith("_kombu.binding.")} == {
        "_kombu.binding.celery",
        f"_kombu.binding.{redis_prefix}.q",
    }
    assert sum(len(v) for k, v in written.items() if not k.startswith("_kombu")) == len(tasks)
    traced = [m for v in written.values() for m in v if TRACEPARENT in str(m)]
    assert len(traced) == 1 and f'"traceparent": "{TRACEPARENT}"' in str(traced[0])
    for key in written:
        if key.startswith("_kombu.binding."):
            assert written[key] == published[key]
            continue
        assert len(written[key]) == len(published[key])
        for mine, theirs in zip(written[key], published[key], strict=True):
            (text, at), (ref, ref_at) = normalised(mine), normalised(theirs)
            assert text == ref
            assert (at is None) == (ref_at is None)
            if at is not None and ref_at is not None:
                # Ours counts from the slot on the manager's clock, send_task from its own now.
                gap = datetime.fromisoformat(ref_at) - datetime.fromisoformat(at)
                assert timedelta(0) <= gap < timedelta(seconds=30)
                assert at.endswith("+00:00") and ref_at.endswith("+00:00")


async def test_the_app_timezone_shapes_expires_as_in_send_task(
    pair: Any, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    direct, kombu = pair(None, timezone="Asia/Kolkata")
    now = SystemClock().now()
    one = [task(redis_prefix, now, "tz", options={"extra": {"expires": 60}})]
    for target in (direct, kombu):
        assert [r.status for r in await target.enqueue(one, now)] == ["enqueued"]
    [mine] = (await dump(redis_client, f"{redis_prefix}w:"))["celery"]
    [theirs] = (await dump(redis_client, f"{redis_prefix}k:"))["celery"]
    assert normalised(mine)[0] == normalised(theirs)[0]
    assert (
        normalised(mine)[1]
        == (now + timedelta(seconds=60))
        .astimezone(datetime.fromisoformat(normalised(theirs)[1] or "").tzinfo)
        .isoformat()
    )
    assert (normalised(mine)[1] or "").endswith("+05:30")


async def test_a_named_exchange_without_a_bound_queue_fails_the_task_without_a_claim(
    pair: Any, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    direct, _ = pair(None)
    now = SystemClock().now()
    lost = task(
        redis_prefix, now, "lost", options={"extra": {"exchange": "nowhere", "routing_key": "x"}}
    )
    ok = task(redis_prefix, now, "ok")
    results = await direct.enqueue([lost, ok], now)
    assert [r.status for r in results] == ["failed", "enqueued"]
    assert "no queue is bound to exchange 'nowhere'" in (results[0].error or "")
    assert await redis_client.exists(f"{redis_prefix}w:claim:{lost.idempotency_key}") == 0
    assert await redis_client.llen(f"{redis_prefix}w:celery") == 1


def test_routes_leave_non_direct_exchanges_and_broadcasts_to_kombu() -> None:
    app = Celery("routes", set_as_current=False)
    app.conf.update(
        task_default_queue="dflt",
        task_queues=[
            Queue("dflt"),
            Queue("topical", Exchange("topical", type="topic"), routing_key="a.#"),
        ],
        task_routes={"t.topic": {"queue": "topical"}, "t.routed": {"queue": "elsewhere"}},
    )
    routes = Routes(app, Layout.of(app))

    def route(name: str, **msg: Any) -> Any:
        return routes.resolve({"name": name, "args": [], "kwargs": {}, **msg})

    assert route("t.plain").queue_list == "dflt"  # the app's default queue
    assert route("t.routed").queue_list == "elsewhere"  # task_routes, a queue created on demand
    assert route("t.routed", queue="mine").queue_list == "mine"  # options.queue wins
    assert route("t.topic") is None  # a topic exchange: kombu's path
    assert route("t.plain", exchange="topical", routing_key="a.b") is None
    named = route("t.plain", exchange="dflt", routing_key="dflt", priority=7)
    assert (named.exchange, named.binding_key, named.priority_suffix) == (
        "dflt",
        "_kombu.binding.dflt",
        "\x06\x166",
    )


def json_values(text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    scalars = (
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    )
    return st.recursive(
        scalars | text,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
        max_leaves=12,
    )


# Plain text (where repr is used), and text with every kind of character that makes repr differ.
PLAIN = st.text(alphabet="ab1 é€.-[{", max_size=8)
ANY = st.text(alphabet="a'\"\\\n\x00\u2028", max_size=4) | st.text()
KWARGS = st.dictionaries(PLAIN, json_values(PLAIN), max_size=5) | st.dictionaries(
    ANY, json_values(ANY), max_size=5
)
ARGS = st.lists(json_values(PLAIN), max_size=5) | st.lists(json_values(ANY), max_size=5)


@settings(max_examples=300, deadline=None)
@given(kwargs=KWARGS, args=ARGS)
def test_argsrepr_and_kwargsrepr_are_celerys_saferepr(
    kwargs: dict[str, Any], args: list[Any]
) -> None:
    for value in (kwargs, args, args or ()):
        for maxlen in (1024, 40):
            assert fast_saferepr(value, maxlen) == saferepr(value, maxlen)


async def test_a_batch_prepared_ahead_writes_the_same_messages_and_a_resend_adds_nothing(
    pair: Any, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    # Staged: built before the slot (no clock), sent at it; the scheduler may send it again.
    direct, _ = pair(None)
    now = SystemClock().now()
    slot = now.replace(microsecond=0) + timedelta(seconds=5)
    tasks = cases(redis_prefix, slot)
    prepared = direct.prepare(tasks)
    first = await direct.send(prepared, slot)
    assert [r.status for r in first] == ["enqueued"] * len(tasks)
    again = await direct.send(prepared, slot + timedelta(seconds=1))
    assert [r.status for r in again] == ["duplicate"] * len(tasks)
    staged = await dump(redis_client, f"{redis_prefix}w:")
    assert sum(len(v) for k, v in staged.items() if not k.startswith("_kombu")) == len(tasks)
    # The same tasks enqueued at the slot by another writer: the very same bytes.
    other = CeleryTarget.from_url(
        direct.app.conf.broker_url,
        prefix=f"{redis_prefix}o",
        config={"broker_transport_options": {"global_keyprefix": f"{redis_prefix}o:"}},
    )
    try:
        assert {r.status for r in await other.enqueue(tasks, slot)} == {"enqueued"}
    finally:
        await other.close()
    at_slot = await dump(redis_client, f"{redis_prefix}o:")
    assert staged.keys() == at_slot.keys()
    for key in staged:
        if not key.startswith("_kombu"):
            assert [normalised(m) for m in staged[key]] == [normalised(m) for m in at_slot[key]]
    # Claims live from the slot: (expires_at - slot) + 60 s.
    claim = f"{redis_prefix}w:claim:{tasks[0].idempotency_key}"
    assert 60_000 < await redis_client.pttl(claim) <= 90_000
