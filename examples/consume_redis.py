"""Consume periodic_manager tasks from a Redis stream with a consumer group.

Copy this into a worker and replace ``handle``. It needs only the ``redis`` package.

    python examples/consume_redis.py --queue default --group workers --consumer w1

The stream of queue Q is ``{<prefix>:Q}:stream`` (prefix ``pm`` by default). The group is
created (with MKSTREAM) at the start of the stream if it does not exist, so tasks enqueued before
the first worker started are delivered too. Each message is printed as one JSON line, then
acknowledged (XACK) - at-least-once: a worker that dies before XACK leaves the message pending,
and this script first re-reads its own pending messages when it starts again. (Messages pending
on a consumer that never comes back can be taken over with XAUTOCLAIM; not shown here.)

Acknowledging after the work is also what tells the manager that a task has finished, for
schedules with ``options.overlap`` skip or hold: set ``PM_REDIS_GROUP`` to this ``--group``.
``--work-s S`` stands in for real work (each message takes S seconds; the printed line then
also says when the work started and finished).

An idle worker waits in XREADGROUP ``BLOCK --block-ms`` (default 5 s), over and over. The client's
own read timeout, ``--socket-timeout`` (default 10 s; redis-py 8 would otherwise apply its own
5 s), must be longer: a read that the client gives up on first ends in a TimeoutError. Should
that happen anyway (a block not shorter than the timeout, a slow network), it means "nothing
yet": the worker reads again, first its own pending messages (a reply the client never read may
have delivered some).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError


def stream_key(prefix: str, queue: str) -> str:
    return f"{{{prefix}:{queue}}}:stream"


def utc_now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


async def handle(stream: str, entry_id: str, fields: dict[str, str], work_s: float) -> None:
    """Do the work. Here: print the message; ``payload`` and ``options`` are JSON text."""
    message: dict[str, Any] = {"stream": stream, "entry_id": entry_id, **fields}
    if work_s:
        message["work_started_at"] = utc_now()
        await asyncio.sleep(work_s)
        message["work_finished_at"] = utc_now()
    print(json.dumps(message, ensure_ascii=False, sort_keys=True), flush=True)


async def ensure_group(client: aioredis.Redis, stream: str, group: str) -> None:
    try:
        await client.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):  # the group exists already: fine
            raise


async def consume(args: argparse.Namespace) -> int:
    stream = stream_key(args.prefix, args.queue)
    client = aioredis.from_url(
        args.redis_url, decode_responses=True, socket_timeout=args.socket_timeout
    )
    done = 0
    try:
        await ensure_group(client, stream, args.group)
        cursor = "0"  # first our own pending (delivered, not acked) messages, then new ones: ">"
        while args.count is None or done < args.count:
            want = 100 if args.count is None else min(100, args.count - done)
            block = None if cursor == "0" else args.block_ms
            try:
                reply = await client.xreadgroup(
                    args.group, args.consumer, {stream: cursor}, count=want, block=block
                )
            except RedisTimeoutError:
                # The client stopped waiting before the server's BLOCK ended: nothing yet. A
                # reply we did not read may have delivered messages to us: read ours first.
                cursor = "0"
                continue
            entries = reply[0][1] if reply else []
            if cursor == "0" and not entries:
                cursor = ">"
                continue
            for entry_id, fields in entries:
                await handle(stream, entry_id, fields, args.work_s)
                await client.xack(stream, args.group, entry_id)
                done += 1
    finally:
        await client.aclose()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--queue", default="default")
    parser.add_argument("--group", default="workers")
    parser.add_argument("--consumer", default="worker-1")
    parser.add_argument("--prefix", default="pm")
    parser.add_argument("--count", type=int, default=None, help="stop after N messages")
    parser.add_argument(
        "--block-ms", type=int, default=5000, help="XREADGROUP BLOCK time (ms, > 0)"
    )
    parser.add_argument(
        "--socket-timeout",
        type=float,
        default=10.0,
        help="seconds the client waits for any reply; longer than the block (default 10)",
    )
    parser.add_argument("--work-s", type=float, default=0.0, help="seconds of work per message")
    args = parser.parse_args(argv)
    if args.block_ms <= 0:  # BLOCK 0 waits forever: every idle read would end in a timeout
        parser.error("--block-ms: must be a positive number of milliseconds")
    if not args.socket_timeout > 0:
        parser.error("--socket-timeout: must be a positive number of seconds")
    if args.block_ms / 1000 >= args.socket_timeout:
        print(
            f"consume_redis: warning: --block-ms {args.block_ms} is not shorter than "
            f"--socket-timeout {args.socket_timeout:g} s: idle reads end in client-side "
            "timeouts (survived, each costs a reconnect)",
            file=sys.stderr,
            flush=True,
        )
    try:
        return asyncio.run(consume(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
