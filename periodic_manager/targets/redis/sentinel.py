"""Noticing a broker that forgot its data: a sentinel key that lives as long as the data does.

A Redis restarted without persistence, flushed, or failed over to an empty replica comes back
answering as if nothing happened, with every claim of a recent slot gone. Each Redis-backed
target keeps one key without expiry beside its claims; every manager remembers the value it
last saw there. When the key is gone (the manager writes a new value) or holds a value the
manager never saw (another manager wrote it after the loss), that Redis lost its data since the
last look. The manager says so once, loudly, and counts it (``periodic_manager_broker_data_lost``);
what is settled lives in the database (``pm_schedule_state.last_done_at``), so a takeover still
sends no settled slot again.
"""

from __future__ import annotations

import asyncio
import os

import redis.asyncio as aioredis

from periodic_manager.targets.redis import lua
from periodic_manager.targets.redis.errors import redis_errors

# Returns the key's value, writing a fresh one first when the key is missing.
LOOK = lua.script("periodic_manager.targets.redis", "sentinel.lua")


class Sentinel:
    """The sentinel key ``key`` of one Redis (``client``); every look bounded by ``timeout``."""

    def __init__(self, client: aioredis.Redis, key: str, *, timeout: float = 5.0) -> None:
        self.client = client
        self.key = key
        self.timeout = timeout
        self._seen: str | None = None
        self._look = client.register_script(LOOK)

    async def lost(self) -> bool:
        """Whether the Redis lost its data since the previous call (never on the first).
        Raises TargetError when Redis cannot be asked."""
        fresh = os.urandom(8).hex()
        with redis_errors("sentinel", self.timeout):
            async with asyncio.timeout(self.timeout):
                value = await self._look(keys=[self.key], args=[fresh])
        text = value.decode() if isinstance(value, bytes) else str(value)
        lost = self._seen is not None and text != self._seen
        self._seen = text
        return lost
