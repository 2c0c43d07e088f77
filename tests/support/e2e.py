"""Shared by the end-to-end tests (tests/behaviour/test_end_to_end.py, and the tests that drive
the same rig: hostile rows, ids, last good versions): the API and its in-process manager on real
services, with a VirtualClock shared by both, and what reached the broker or the outbox."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import redis.asyncio as aioredis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.api.app import create_app
from periodic_manager.api.state import state_of
from periodic_manager.clock import VirtualClock
from periodic_manager.db.engine import create_engine
from periodic_manager.runtime.assemble import build_manager
from periodic_manager.runtime.manager import PeriodicTaskManager
from periodic_manager.settings import Settings

T0 = datetime(2024, 5, 1, 12, 0, 0, 500000, tzinfo=UTC)  # half a second past a minute
MINUTE = timedelta(minutes=1)


def at(hh: int, mm: int, ss: int = 0) -> datetime:
    return datetime(2024, 5, 1, hh, mm, ss, tzinfo=UTC)


def iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Rig:
    client: httpx.AsyncClient
    manager: PeriodicTaskManager
    clock: VirtualClock
    engine: AsyncEngine
    settings: Settings
    redis: aioredis.Redis | None

    async def advance_to(self, instant: datetime) -> None:
        await self.clock.advance_to(
            instant, settle=lambda: self.manager.wait_settled(self.clock.now())
        )

    async def messages(self, queue: str = "default") -> list[dict[str, Any]]:
        """Every message of ``queue``, as the Redis stream's field dict."""
        if self.settings.target == "redis":
            assert self.redis is not None
            key = f"{{{self.settings.stream_prefix}:{queue}}}:stream"
            return [fields for _, fields in await self.redis.xrange(key)]
        async with self.engine.connect() as conn:
            rows = (
                await conn.execute(
                    text(
                        "SELECT task_id, task_type, payload, queue, name, idempotency_key, scheduled_at,"
                        " enqueued_at, options FROM pm_outbox WHERE queue = :q ORDER BY seq"
                    ),
                    {"q": queue},
                )
            ).all()
        out = []
        for r in rows:
            sched, enq = (
                v if isinstance(v, datetime) else datetime.fromisoformat(v) for v in (r[6], r[7])
            )
            out.append(
                {
                    "id": r[0],
                    "type": r[1],
                    "payload": r[2],
                    "queue": r[3],
                    "name": r[4],
                    "idempotency_key": r[5],
                    "scheduled_at": iso(sched.replace(tzinfo=sched.tzinfo or UTC)),
                    "enqueued_at": iso(enq.replace(tzinfo=enq.tzinfo or UTC)),
                    "options": r[8],
                }
            )
        return out

    async def slots(self, name: str, queue: str = "default") -> list[str]:
        return [m["scheduled_at"] for m in await self.messages(queue) if m["name"] == name]


async def e2e_rig(
    db_url: str,
    target: str,
    redis_prefix: str,
    redis_url: str,
    *,
    start: datetime = T0,
    **overrides: Any,
) -> AsyncIterator[Rig]:
    """Yields one Rig: the API with its manager on ``db_url`` and ``target`` (outbox or redis),
    from ``start`` (use as ``async for rig in e2e_rig(...)`` in a fixture)."""
    # One leader: this VirtualClock jumps minutes at once, past the trust of partition leases
    # (their expiry is the database's real time); partitions run in test_partition_moves.py.
    # No change signal (LISTEN, MariaDB's poll): they run on the wall clock, so a plain-SQL edit
    # would be synced at whatever virtual instant its signal came in, and that sync would set the
    # phase of the sync loop (which then missed the 12:03 slot of test_end_to_end now and then);
    # here SQL edits are seen at the next sync, and the API's own edits at once. The signals
    # are tested in tests/runtime/test_change_signal.py.
    settings = Settings(
        database_url=db_url,
        target=target,
        redis_url=redis_url,
        stream_prefix=redis_prefix,
        sync_interval=30,
        grace=30,
        heartbeat_interval=5,
        **{"coordination": "leader", "listen": False, **overrides},
    )
    clock = VirtualClock(start)
    engine = create_engine(db_url)
    app = create_app(
        settings,
        clock=clock,
        engine=engine,
        manager_factory=lambda eng: build_manager(settings, eng, clock=clock),
    )
    redis = aioredis.from_url(redis_url, decode_responses=True) if target == "redis" else None
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://localhost"
            ) as client:
                yield Rig(client, state_of(app).manager, clock, engine, settings, redis)
    finally:
        if redis is not None:
            await redis.aclose()
        await engine.dispose()
