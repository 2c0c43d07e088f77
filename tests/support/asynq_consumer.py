"""A reference consumer of asynq tasks, written here from asynq's server protocol (v0.24 to v0.26:
``internal/rdb/rdb.go``, ``internal/base/base.go``, ``internal/proto/asynq.proto``) so that the
tests can check what an unmodified ``asynq.Server`` would do with our tasks, without Go.

It follows the server's steps on the same keys, fields and states, with scripts of our own:

- dequeue: unless ``asynq:{q}:paused`` exists, move one id from the right of ``pending`` to
  ``active``, set the hash's ``state`` to ``active``, drop ``pending_since``, add the id to
  ``lease`` and return ``msg``;
- done: remove the id from ``active`` and ``lease`` and delete the hash, each refusing with
  ``NOT FOUND`` when the id is not there (as asynq's script does), count it processed, release
  the uniqueness lock if the task holds it; with ``retention``, mark it ``completed`` instead (the
  message with ``completed_at``, the id in ``completed`` scored by its expiry);
- a failure: ``retry`` (the message with ``retried`` + 1, ``error_msg``, ``last_failed_at``; the
  id in ``retry``) or, once ``retried`` reached ``retry``, ``archived``.

Messages are read and written with a protobuf wire codec of its own (:func:`decode`,
:func:`encode`, from asynq.proto's field numbers), not with the target's descriptor: a wrong
field number on either side shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

# asynq.proto: field numbers and kinds ("s" string, "b" bytes, "i" integer, "m" string map,
# "ts" Timestamp, "rs" repeated string).
TASK_MESSAGE = {
    1: ("type", "s"),
    2: ("payload", "b"),
    15: ("headers", "m"),
    3: ("id", "s"),
    4: ("queue", "s"),
    5: ("retry", "i"),
    6: ("retried", "i"),
    7: ("error_msg", "s"),
    11: ("last_failed_at", "i"),
    8: ("timeout", "i"),
    9: ("deadline", "i"),
    10: ("unique_key", "s"),
    14: ("group_key", "s"),
    12: ("retention", "i"),
    13: ("completed_at", "i"),
}
SCHEDULER_ENTRY = {
    1: ("id", "s"),
    2: ("spec", "s"),
    3: ("task_type", "s"),
    4: ("task_payload", "b"),
    5: ("enqueue_options", "rs"),
    6: ("next_enqueue_time", "ts"),
    7: ("prev_enqueue_time", "ts"),
}
SCHEDULER_ENQUEUE_EVENT = {1: ("task_id", "s"), 2: ("enqueue_time", "ts")}
_DEFAULTS = {"s": "", "b": b"", "i": 0, "m": {}, "ts": None, "rs": []}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) of every field on the wire: varints as ints, the rest as bytes."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            out.append((number, value))
        elif wire == 2:
            size, pos = _varint(data, pos)
            out.append((number, data[pos : pos + size]))
            pos += size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            out.append((number, data[pos : pos + size]))
            pos += size
        else:
            raise ValueError(f"wire type {wire} of field {number}")
    return out


def _signed(value: int) -> int:
    """A varint read as a signed 64-bit integer (int32 and int64 fields)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def decode(data: bytes, schema: dict[int, tuple[str, str]]) -> dict[str, Any]:
    """A message of ``schema`` decoded from the wire (unset fields at their defaults)."""
    out: dict[str, Any] = {name: _DEFAULTS[kind] for name, kind in schema.values()}
    for number, value in _fields(data):
        if number not in schema:
            raise ValueError(f"unknown field {number}")
        name, kind = schema[number]
        if kind == "i":
            assert isinstance(value, int)
            out[name] = _signed(value)
        elif kind in ("s", "b", "rs"):
            assert isinstance(value, bytes)
            item = value.decode() if kind != "b" else value
            out[name] = [*out[name], item] if kind == "rs" else item
        elif kind == "ts":
            assert isinstance(value, bytes)
            parts = dict(_fields(value))
            seconds, nanos = parts.get(1, 0), parts.get(2, 0)
            assert isinstance(seconds, int) and isinstance(nanos, int)
            out[name] = (_signed(seconds), nanos)
        else:  # map<string, string>: entries of key (1) and value (2)
            assert isinstance(value, bytes)
            entry = dict(_fields(value))
            out[name] = {**out[name], bytes(entry[1]).decode(): bytes(entry.get(2, b"")).decode()}
    return out


def _put_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def encode_task(msg: dict[str, Any]) -> bytes:
    """A TaskMessage on the wire (proto3: fields at their default are left out)."""
    out = bytearray()
    for number, (name, kind) in TASK_MESSAGE.items():
        value = msg.get(name, _DEFAULTS[kind])
        if kind == "i" and value:
            out += _put_varint(number << 3) + _put_varint(value)
        elif kind in ("s", "b") and value:
            raw = value.encode() if kind == "s" else value
            out += _put_varint(number << 3 | 2) + _put_varint(len(raw)) + raw
        elif kind == "m":
            for key, item in value.items():
                entry = encode_pairs([(1, key.encode()), (2, item.encode())])
                out += _put_varint(number << 3 | 2) + _put_varint(len(entry)) + entry
    return bytes(out)


def encode_pairs(pairs: list[tuple[int, bytes]]) -> bytes:
    return b"".join(_put_varint(n << 3 | 2) + _put_varint(len(v)) + v for n, v in pairs)


# -- the server's steps ---------------------------------------------------------------------------

# KEYS: pending, paused, active, lease. ARGV: lease expiry (Unix s), the task-key prefix.
DEQUEUE = """
if redis.call('EXISTS', KEYS[2]) == 1 then return false end
local id = redis.call('RPOPLPUSH', KEYS[1], KEYS[3])
if not id then return false end
local key = ARGV[2] .. id
redis.call('HSET', key, 'state', 'active')
redis.call('HDEL', key, 'pending_since')
redis.call('ZADD', KEYS[4], ARGV[1], id)
return redis.call('HGET', key, 'msg')
"""
# KEYS: active, lease, the task, processed:<day>, processed, [the unique lock]. ARGV: id, the
# day counter's expiry (Unix s); then, for "complete": completed, its score, the new msg.
FINISH = """
if redis.call('LREM', KEYS[1], 0, ARGV[1]) == 0 then return redis.error_reply('NOT FOUND') end
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then return redis.error_reply('NOT FOUND') end
if ARGV[3] == 'complete' then
  if redis.call('ZADD', KEYS[6], ARGV[4], ARGV[1]) ~= 1 then return redis.error_reply('INTERNAL') end
  redis.call('HSET', KEYS[3], 'msg', ARGV[5], 'state', 'completed')
elseif redis.call('DEL', KEYS[3]) == 0 then
  return redis.error_reply('NOT FOUND')
end
if redis.call('INCR', KEYS[4]) == 1 then redis.call('EXPIREAT', KEYS[4], ARGV[2]) end
redis.call('INCR', KEYS[5])
local lock = KEYS[6]
if ARGV[3] == 'complete' then lock = KEYS[7] end
if lock and redis.call('GET', lock) == ARGV[1] then redis.call('DEL', lock) end
return 'OK'
"""
# KEYS: the task, active, lease, retry or archived, failed total. ARGV: id, msg, score, state.
FAIL = """
if redis.call('LREM', KEYS[2], 0, ARGV[1]) == 0 then return redis.error_reply('NOT FOUND') end
if redis.call('ZREM', KEYS[3], ARGV[1]) == 0 then return redis.error_reply('NOT FOUND') end
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[1], 'msg', ARGV[2], 'state', ARGV[4])
redis.call('INCR', KEYS[5])
return 'OK'
"""


@dataclass
class Consumer:
    """Runs asynq's server steps on ``client`` (bytes replies) at the instants it is given."""

    client: aioredis.Redis

    def _keys(self, queue: str) -> dict[str, str]:
        base = f"asynq:{{{queue}}}:"
        names = ("pending", "paused", "active", "lease", "completed", "retry", "archived")
        return {**{n: base + n for n in names}, "t": base + "t:", "base": base}

    async def dequeue(self, queue: str, now: float) -> dict[str, Any] | None:
        """The next task of ``queue`` taken as asynq's dequeue takes it (None: none)."""
        k = self._keys(queue)
        keys = [k["pending"], k["paused"], k["active"], k["lease"]]
        raw = await self.client.eval(DEQUEUE, 4, *keys, int(now) + 30, k["t"])
        return None if raw is None else decode(raw, TASK_MESSAGE)

    async def done(self, msg: dict[str, Any], now: float) -> None:
        """The handler succeeded: done, or completed when the task has a retention."""
        k = self._keys(msg["queue"])
        day = k["base"] + "processed:" + _day(now)
        keys = [k["active"], k["lease"], k["t"] + msg["id"], day, k["base"] + "processed"]
        args: list[Any] = [msg["id"], int(now) + 90 * 86400]
        if msg["retention"]:
            encoded = encode_task({**msg, "completed_at": int(now)})
            keys.append(k["completed"])
            args += ["complete", int(now) + msg["retention"], encoded]
        else:
            args.append("done")
        if msg["unique_key"]:
            keys.append(msg["unique_key"])
        await self.client.eval(FINISH, len(keys), *keys, *args)

    async def fail(self, msg: dict[str, Any], now: float, error: str) -> str:
        """The handler failed: ``retry`` while retries are left, else ``archived``."""
        k = self._keys(msg["queue"])
        archive = msg["retried"] >= msg["retry"]
        state = "archived" if archive else "retry"
        changed = {**msg, "error_msg": error, "last_failed_at": int(now)}
        if not archive:
            changed["retried"] = msg["retried"] + 1
        keys = [k["t"] + msg["id"], k["active"], k["lease"], k[state], k["base"] + "failed"]
        await self.client.eval(
            FAIL, len(keys), *keys, msg["id"], encode_task(changed), int(now) + 60, state
        )
        return state

    async def drain(
        self, queue: str, now: float, handler: Callable[[dict[str, Any]], bool]
    ) -> list[dict[str, Any]]:
        """Run every pending task of ``queue`` once through ``handler`` (True: success), as an
        asynq server would; the messages taken, in order."""
        taken = []
        while (msg := await self.dequeue(queue, now)) is not None:
            taken.append(msg)
            if handler(msg):
                await self.done(msg, now)
            else:
                await self.fail(msg, now, "handler failed")
        return taken


def _day(now: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(now))
