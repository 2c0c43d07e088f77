"""Noticing a broker that forgot its data: a sentinel key that lives as long as the data does.

A Redis restarted without persistence, flushed, or failed over to an empty replica comes back
answering as if nothing happened, with every claim of a recent slot gone. Each Redis-backed
target keeps one key without expiry beside its claims; every manager remembers the value it
last saw there. When the key is gone (the manager writes a new value) or holds a value the
manager never saw (another manager wrote it after the loss), that Redis lost its data since the
last look. The manager says so once, loudly, and counts it (``periodic_manager_broker_data_lost``);
what is settled lives in the database (``pm_schedule_state.last_done_at``), so a takeover still
sends no settled slot again.

On a Redis Cluster every master keeps its own data and may lose it alone, so
:class:`ClusterSentinel` keeps one key per master: ``{<prefix>:sentinel:<n>}``, for each master
the smallest ``n`` whose key hashes to a slot that master serves (read from the client's slot
map at every look, so every manager picks the same keys and a resharding moves a key with its
value, never for a loss).
"""

from __future__ import annotations

import asyncio
import os

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from periodic_manager.targets.redis import lua
from periodic_manager.targets.redis.errors import redis_errors
from periodic_manager.targets.redis.lua import text

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


class ClusterSentinel:
    """One sentinel key per master of a Redis Cluster (``client``), named from ``prefix``;
    every look bounded by ``timeout``. :meth:`lost` is True when any master lost its data."""

    def __init__(self, client: RedisCluster, prefix: str, *, timeout: float = 5.0) -> None:
        self.client = client
        self.prefix = prefix
        self.timeout = timeout
        self._seen: dict[str, str] = {}  # key -> the value last seen there
        # redis-py types register_script for Redis only; its script runs on a cluster client too
        # (EVALSHA routed by the key, SCRIPT LOAD on every master).
        self._look = client.register_script(LOOK)  # type: ignore[misc]
        self.lost_keys: list[str] = []  # the keys found lost by the last look

    def key(self, n: int) -> str:
        return f"{{{self.prefix}:sentinel:{n}}}"

    def keys(self) -> dict[str, str]:
        """Node name -> its sentinel key, for every master that serves a slot now."""
        manager = self.client.nodes_manager
        owners = {slot: nodes[0].name for slot, nodes in manager.slots_cache.items() if nodes}
        wanted = set(owners.values())
        out: dict[str, str] = {}
        n = 0
        while len(out) < len(wanted):  # ends: each wanted master serves at least one slot
            key = self.key(n)
            owner = owners.get(self.client.keyslot(key))
            if owner is not None and owner not in out:
                out[owner] = key
            n += 1
        return out

    async def lost(self) -> bool:
        """Whether a master lost its data since the previous call (never on the first look of a
        key). Raises TargetError when a master cannot be asked."""
        with redis_errors("sentinel", self.timeout):
            async with asyncio.timeout(self.timeout):
                await self.client.initialize()  # the slot map (a no-op once read)
                keys = sorted(self.keys().values())
                values = await asyncio.gather(
                    *(self._look(keys=[key], args=[os.urandom(8).hex()]) for key in keys)
                )
        self.lost_keys = []
        for key, value in zip(keys, values, strict=True):
            seen = self._seen.get(key)
            if seen is not None and text(value) != seen:
                self.lost_keys.append(key)
            self._seen[key] = text(value)
        return bool(self.lost_keys)
