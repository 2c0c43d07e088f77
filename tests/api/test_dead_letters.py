"""GET /dead-letters, replay (one, by filter) and purge, on every backend."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.db.http_deliveries import DEAD, DONE, PENDING, DeliveryStore
from periodic_manager.db.models import http_deliveries_table as table
from tests.support.api import T0, assert_problem, iso


def row(name: str, minute: int, state: str, **extra: Any) -> dict[str, Any]:
    slot = T0 + timedelta(minutes=minute)
    return {
        "idempotency_key": f"{name}:{iso(slot)}",
        "name": name,
        "slot_at": slot,
        "host": "hooks.example.com:443",
        "request": '{"url":"https://hooks.example.com/in"}',
        "body": "{}",
        "state": state,
        "attempts": 3,
        "created_at": T0,
        "next_attempt_at": T0,
        "last_status": None,
        "last_error": None,
        "last_body": None,
        "finished_at": None,
        **extra,
    }


async def seed(engine: AsyncEngine) -> None:
    dead = {"last_status": 410, "last_error": "HTTP 410: a permanent answer", "last_body": "gone"}
    await DeliveryStore(engine).insert(
        [
            row("a", 1, DEAD, finished_at=T0, **dead),
            row("a", 2, DEAD, finished_at=T0, **dead),
            row("b", 1, DEAD, finished_at=T0, **dead),
            row("b", 2, PENDING),
            row("c", 1, DONE),
        ]
    )


async def stored(engine: AsyncEngine) -> dict[str, tuple[str, int]]:
    async with engine.connect() as conn:
        found = await conn.execute(select(table.c.idempotency_key, table.c.state, table.c.attempts))
        return {k: (s, a) for k, s, a in found.all()}


async def test_dead_letters_are_listed_with_what_befell_them(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    assert (await client.get("/dead-letters")).json() == {"items": [], "next_after_id": None}
    await seed(engine)
    body = (await client.get("/dead-letters")).json()
    assert [(x["schedule"], x["slot"]) for x in body["items"]] == [
        ("a", iso(T0 + timedelta(minutes=1))),
        ("a", iso(T0 + timedelta(minutes=2))),
        ("b", iso(T0 + timedelta(minutes=1))),
    ]
    first = body["items"][0]
    assert first["idempotency_key"] == f"a:{iso(T0 + timedelta(minutes=1))}"
    assert (first["last_status"], first["attempts"], first["body_excerpt"]) == (410, 3, "gone")
    assert first["url"] == "https://hooks.example.com/in" and "permanent" in first["last_error"]
    page = (await client.get("/dead-letters", params={"limit": 2})).json()
    assert len(page["items"]) == 2 and page["next_after_id"] == page["items"][1]["id"]
    rest = await client.get("/dead-letters", params={"after_id": page["next_after_id"]})
    assert [x["schedule"] for x in rest.json()["items"]] == ["b"]
    only_b = (await client.get("/dead-letters", params={"schedule": "b"})).json()["items"]
    assert [x["schedule"] for x in only_b] == ["b"]


async def test_a_replay_makes_it_pending_again_with_its_key(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    await seed(engine)
    letter = (await client.get("/dead-letters")).json()["items"][0]
    r = await client.post(f"/dead-letters/{letter['id']}/replay")
    assert r.status_code == 200 and r.json() == {"count": 1}
    assert (await stored(engine))[letter["idempotency_key"]] == (PENDING, 0)
    assert_problem(await client.post(f"/dead-letters/{letter['id']}/replay"), 404)  # not dead now
    assert_problem(await client.post("/dead-letters/999999/replay"), 404)
    assert_problem(await client.post("/dead-letters/0/replay"), 422)


async def test_replay_and_purge_by_filter(client: httpx.AsyncClient, engine: AsyncEngine) -> None:
    await seed(engine)
    problem = assert_problem(await client.post("/dead-letters/replay", json={}), 422)
    assert problem["errors"][0]["field"] == "all"
    r = await client.post("/dead-letters/replay", json={"schedule": "a"})
    assert r.json() == {"count": 2}
    states = await stored(engine)
    assert sorted(s for s, _ in states.values()) == [DEAD, DONE, PENDING, PENDING, PENDING]
    assert_problem(await client.post("/dead-letters/purge", json={"ids": [-1]}), 422)
    assert (await client.post("/dead-letters/purge", json={"all": True})).json() == {"count": 1}
    assert DEAD not in {s for s, _ in (await stored(engine)).values()}
    assert (await client.post("/dead-letters/replay", json={"all": True})).json() == {"count": 0}
