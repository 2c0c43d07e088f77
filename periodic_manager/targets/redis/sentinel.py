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

import os
from typing import Any

from redis.exceptions import RedisError

from periodic_manager.errors import TargetError

# Returns the key's value, writing ARGV[1] first when the key is missing.
_LOOK = """
local value = redis.call('GET', KEYS[1])
if not value then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return value
"""


class Sentinel:
    """The sentinel key ``key`` of one Redis (``client``)."""

    def __init__(self, client: Any, key: str) -> None:
        self.client = client
        self.key = key
        self._seen: str | None = None
        self._look = client.register_script(_LOOK)

    async def lost(self) -> bool:
        """Whether the Redis lost its data since the previous call (never on the first).
        Raises TargetError when Redis cannot be asked."""
        fresh = os.urandom(8).hex()
        try:
            value = await self._look(keys=[self.key], args=[fresh])
        except (RedisError, OSError, TimeoutError) as exc:
            raise TargetError(f"sentinel: {type(exc).__name__}: {exc}") from exc
        text = value.decode() if isinstance(value, bytes) else str(value)
        lost = self._seen is not None and text != self._seen
        self._seen = text
        return lost
