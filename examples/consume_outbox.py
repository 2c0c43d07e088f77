"""Consume periodic_manager tasks from the database outbox table ``pm_outbox``.

Copy this into a worker and replace ``handle``. It needs only SQLAlchemy and the async driver
(asyncpg, aiosqlite or asyncmy).

    python examples/consume_outbox.py --database-url postgresql://... --queue default

Each round takes up to ``--batch`` unprocessed rows of the queue in one transaction, handles them
(here: prints one JSON line per message), sets ``processed_at`` and commits. A worker that dies
mid-batch rolls back, so its rows are taken again: at-least-once.

PostgreSQL, MariaDB >= 10.6 and MySQL 8: rows are taken with ``SELECT ... FOR UPDATE SKIP
LOCKED``, so any number of consumers can run side by side; each row goes to one of them.

SQLite has no row locks and no SKIP LOCKED: run ONE consumer at a time per database there (two
would read the same rows before either commits).

``processed_at`` is also what tells the manager that a task has finished, for schedules with
``options.overlap`` skip or hold (it is set when the batch commits: ``--batch 1`` for long tasks).
``--work-s S`` stands in for real work (each message takes S seconds; the printed line then also
says when the work started and finished).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, Text, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

# The columns this consumer reads and writes (the table itself is created by the migrations).
outbox = Table(
    "pm_outbox",
    MetaData(),
    Column("seq", Integer, primary_key=True),
    Column("task_id", String(36)),
    Column("idempotency_key", String(300)),
    Column("queue", String(100)),
    Column("name", String(200)),
    Column("task_type", String(200)),
    Column("payload", Text),  # JSON text
    Column("options", Text),  # JSON text
    Column("scheduled_at", DateTime(timezone=True)),
    Column("enqueued_at", DateTime(timezone=True)),
    Column("processed_at", DateTime(timezone=True)),
)


def async_url(url: str) -> str:
    """Accept plain ``postgresql://`` / ``sqlite:///`` / ``mysql://`` / ``mariadb://`` URLs and
    pick the async drivers."""
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres"):
        u = u.set(drivername="postgresql+asyncpg")
    elif u.drivername == "sqlite":
        u = u.set(drivername="sqlite+aiosqlite")
    elif u.drivername in ("mysql", "mariadb"):
        u = u.set(drivername="mysql+asyncmy").update_query_dict({"charset": "utf8mb4"})
    return u.render_as_string(hide_password=False)


def make_engine(database_url: str) -> AsyncEngine:
    """The consumer's engine. MariaDB/MySQL: sessions in UTC, whatever the server's time zone,
    and READ COMMITTED, so that a consumer's locks are its rows alone (no gap locks that would
    block the others)."""
    url = async_url(database_url)
    if url.startswith("mysql"):
        return create_async_engine(
            url,
            connect_args={"init_command": "SET time_zone = '+00:00'"},
            isolation_level="READ COMMITTED",
        )
    return create_async_engine(url)


def naive_utc(dialect: str) -> bool:
    """SQLite and MariaDB/MySQL store instants as naive UTC (the manager writes them so)."""
    return dialect != "postgresql"


def utc_iso(value: datetime) -> str:
    """SQLite and MariaDB/MySQL return naive datetimes: the outbox stores UTC there."""
    utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    text = utc.isoformat(timespec="microseconds" if utc.microsecond else "seconds")
    return text.replace("+00:00", "Z")


async def claim_batch(conn: AsyncConnection, queue: str, limit: int) -> list[dict[str, Any]]:
    """Lock up to ``limit`` unprocessed rows of ``queue``, oldest first (call inside a transaction).

    The rows are messages with the same fields as on Redis Streams, plus ``seq``.
    """
    query = (
        select(outbox)
        .where(outbox.c.queue == queue, outbox.c.processed_at.is_(None))
        .order_by(outbox.c.seq)
        .limit(limit)
    )
    if conn.dialect.name != "sqlite":
        query = query.with_for_update(skip_locked=True)
    rows = (await conn.execute(query)).mappings().all()
    return [
        {
            "seq": row["seq"],
            "id": row["task_id"],
            "type": row["task_type"],
            "payload": row["payload"],
            "queue": row["queue"],
            "name": row["name"],
            "idempotency_key": row["idempotency_key"],
            "scheduled_at": utc_iso(row["scheduled_at"]),
            "enqueued_at": utc_iso(row["enqueued_at"]),
            "options": row["options"],
        }
        for row in rows
    ]


async def mark_processed(conn: AsyncConnection, seqs: list[int]) -> None:
    now = datetime.now(UTC)
    if naive_utc(conn.dialect.name):
        now = now.replace(tzinfo=None)  # stored as naive UTC, like the manager writes it
    await conn.execute(update(outbox).where(outbox.c.seq.in_(seqs)).values(processed_at=now))


def utc_now() -> str:
    return utc_iso(datetime.now(UTC))


async def handle(message: dict[str, Any], work_s: float) -> None:
    """Do the work. Here: print the message; ``payload`` and ``options`` are JSON text."""
    if work_s:
        message["work_started_at"] = utc_now()
        await asyncio.sleep(work_s)
        message["work_finished_at"] = utc_now()
    print(json.dumps(message, ensure_ascii=False, sort_keys=True), flush=True)


async def consume(args: argparse.Namespace) -> int:
    engine = make_engine(args.database_url)
    done = 0
    try:
        while args.count is None or done < args.count:
            limit = args.batch if args.count is None else min(args.batch, args.count - done)
            async with engine.begin() as conn:
                messages = await claim_batch(conn, args.queue, limit)
                for message in messages:
                    await handle(message, args.work_s)
                if messages:
                    await mark_processed(conn, [m["seq"] for m in messages])
            done += len(messages)
            if not messages:
                await asyncio.sleep(args.poll_interval)
    finally:
        await engine.dispose()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--queue", default="default")
    parser.add_argument("--count", type=int, default=None, help="stop after N messages")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="seconds when idle")
    parser.add_argument("--batch", type=int, default=100, help="rows per transaction")
    parser.add_argument("--work-s", type=float, default=0.0, help="seconds of work per message")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(consume(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
