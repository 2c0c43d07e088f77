"""Celery messages straight into a Redis broker: claim and LPUSH in one Lua script per chunk.

Chunks of ``CHUNK`` tasks, each one script call whose tasks travel as a single JSON argument (and
their messages as one concatenated argument), all chunks in flight at once (each on a connection
of the pool), every call bounded by ``timeout``.

Work is split in two so the manager can do the first part before a slot is due:

- :meth:`RedisWriter.prepare` builds the script arguments of a batch: the message texts, claim
  TTLs and destinations. Pure computation, no I/O.
- :meth:`RedisWriter.start` starts the script calls, :meth:`RedisWriter.results` gathers one flag
  per task (what :mod:`~periodic_manager.targets.celery.direct` makes results of).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import count
from typing import Any

import redis.asyncio as aioredis

from periodic_manager.contracts import Task
from periodic_manager.targets.celery.wire import Delivery, Layout, WireFormat
from periodic_manager.targets.redis import lua
from periodic_manager.targets.redis.claims import RedisClaims
from periodic_manager.targets.redis.errors import redis_errors

# Claims and pushes a chunk (its arguments and flags are written at its top).
CLAIM_AND_PUSH = lua.script("periodic_manager.targets.celery", "claim_and_push.lua")
CHUNK = 1000  # tasks per script call (also the most values of one LPUSH: far below Lua's limit)


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """The arguments of one script call (a chunk of a batch); ``size`` tasks."""

    args: tuple[bytes, bytes, bytes, bytes]
    size: int


class RedisWriter:
    """Claims and pushes Celery messages with one script call per chunk of tasks."""

    def __init__(
        self,
        client: aioredis.Redis,
        wire: WireFormat,
        *,
        layout: Layout,
        claims: RedisClaims,
        timeout: float,
    ) -> None:
        self.client = client
        self.wire = wire
        self.claims = claims  # their keys and TTLs: a slot has one claim whichever way it went
        self.timeout = timeout
        self._keyprefix = layout.keyprefix
        self._sep = layout.sep
        self._script = client.register_script(CLAIM_AND_PUSH)
        # kombu tags every message with a fresh uuid4 (its key among unacknowledged messages).
        # A random 72-bit prefix per writer plus a counter is as unique, at a fraction of the cost.
        head = uuid.uuid4().hex
        self._tag_head = f"{head[:8]}-{head[8:12]}-4{head[13:16]}-a{head[17:20]}-"
        self._tags = count()

    def prepare(
        self,
        items: Sequence[tuple[Task, Mapping[str, Any], Delivery]],
        now: datetime | None,
        prevs: Sequence[Sequence[Any] | None] | None = None,
    ) -> list[ScriptCall]:
        """The script calls for ``items`` (task, send_task arguments, delivery). No I/O.

        ``now``: when they will be sent; None: each at its task's slot (staged ahead). Claim TTLs
        and relative expiries count from that instant. ``prevs`` (options.overlap), one per
        item: the compare-and-set of its schedule's previous-task key (key, value read, new
        value, TTL ms), or None."""
        calls = []
        ttl_memo: dict[tuple[datetime, datetime], int] = {}  # a burst shares one slot: one TTL
        for start in range(0, len(items), CHUNK):
            chunk = items[start : start + CHUNK]
            destinations: dict[Delivery, int] = {}
            rows: list[tuple[Any, ...]] = []
            messages = []
            for n, (task, msg, delivery) in enumerate(chunk, start):
                index = destinations.get(delivery)
                if index is None:
                    index = destinations[delivery] = len(destinations) + 1
                at = task.scheduled_at if now is None else now
                ttl = ttl_memo.get((task.expires_at, at))
                if ttl is None:
                    ttl = ttl_memo[(task.expires_at, at)] = self.claims.ttl_ms(task, at)
                tag = f"{self._tag_head}{next(self._tags) & 0xFFFFFFFFFFFF:012x}"
                message = self.wire.envelope(msg, delivery, at, tag)
                messages.append(message)
                # Messages are ASCII (JSON with ensure_ascii): characters are bytes.
                row: tuple[Any, ...] = (task.idempotency_key, task.id, ttl, index, len(message))
                prev = prevs[n] if prevs is not None else None
                rows.append(row if prev is None else (*row, *prev))
            meta = {"d": [self._destination(d) for d in destinations], "t": rows}
            text = json.dumps(meta, ensure_ascii=False, separators=(",", ":"))
            # Encoded once here: redis-py passes bytes through untouched (a resend re-encodes nothing).
            args = (
                self.claims.key("").encode(),
                text.encode(),
                "".join(messages).encode("ascii"),
                str(self.claims.stale_ms).encode(),
            )
            calls.append(ScriptCall(args, len(chunk)))
        return calls

    def _destination(self, d: Delivery) -> list[str]:
        declare_key, declare_member = d.declare or ("", "")
        return [
            d.queue_list,
            d.binding_key,
            d.routing_key if d.binding_key else "",
            declare_key,
            declare_member,
            self._keyprefix,
            d.priority_suffix,
            self._sep,
        ]

    def start(self, calls: Sequence[ScriptCall]) -> list[asyncio.Future[Any]]:
        """Start ``calls``, all at once (each a task of its own: its request goes out at the next
        turn of the event loop, whatever the caller does next)."""
        return [asyncio.ensure_future(self._call(call)) for call in calls]

    async def results(self, started: Sequence[asyncio.Future[Any]]) -> list[int]:
        """The flags of started calls, one per task, in order (redis/flags.py: NEW, SENT,
        UNROUTABLE, BUSY, RESEND, WRONGTYPE, or ELSEWHERE: being published through kombu by another
        publisher). Once every call has ended, raises the first failure
        as TargetError (``no answer within`` for a call that took longer than ``timeout``); the
        calls that went through keep their effects (each is atomic)."""
        flags: list[int] = []
        with redis_errors("celery: redis", self.timeout):
            for reply in await asyncio.gather(*started, return_exceptions=True):
                if isinstance(reply, BaseException):
                    raise reply
                flags += map(int, reply)
        return flags

    async def _call(self, call: ScriptCall) -> Any:
        # One EVALSHA per chunk on its own connection: Redis runs them one after the other while
        # the next chunk is being built. The script object loads itself after a NoScriptError
        # (a restarted or flushed server); the claims make a second run harmless.
        async with asyncio.timeout(self.timeout):
            return await self._script(keys=[], args=list(call.args))
