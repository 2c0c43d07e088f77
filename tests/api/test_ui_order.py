"""The dashboard's next-slot order (``api/ui/order.py``) at scale: a full read never holds every
row's payload at once, and a clock stepping back reads nothing."""

from __future__ import annotations

import tracemalloc
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from periodic_manager.api.ui.listing import NextSlots
from periodic_manager.api.ui.order import ENABLED, NextSlotOrder
from periodic_manager.db import changes
from periodic_manager.db import judge as dbjudge
from periodic_manager.db.engine import create_engine, on_mysql, on_sqlite, reads_bytes

ROWS = 8000
PAYLOAD_CHARS = 16_000  # 128 MB of payloads in all, 16 MB per partition of 1000 rows
NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)


async def test_full_read_does_not_hold_every_payload(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_engine(db_url)
    try:
        async with engine.begin() as conn:
            if on_sqlite(conn):
                rows = (
                    "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < :n)"
                )
                payload = "'\"' || replace(hex(zeroblob(:c / 2)), '0', 'x') || '\"'"
                sql = f"{rows} SELECT 'job.' || i, '* * * * *', 't', {payload} FROM g"
            elif on_mysql(conn):  # MariaDB's sequence tables (seq_1_to_N)
                payload = "CONCAT('\"', REPEAT('x', :c), '\"')"
                sql = (
                    f"SELECT CONCAT('job.', seq), '* * * * *', 't', {payload} FROM seq_1_to_{ROWS}"
                )
            else:
                payload = "to_jsonb(repeat('x', :c))"
                sql = (
                    f"SELECT 'job.' || i, '* * * * *', 't', {payload} FROM generate_series(1, :n) i"
                )
            await conn.execute(
                text(f"INSERT INTO periodic_jobs (name, spec, task_type, payload) {sql}"),
                {"n": ROWS, "c": PAYLOAD_CHARS},
            )
        rules = dbjudge.Rules(reads_bytes(engine))
        order = NextSlotOrder(NextSlots())
        async with engine.connect() as conn:
            tracemalloc.start()
            try:
                keys = await order.snapshot(conn, NOW, rules)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert len(keys) == ROWS and all(k[0] == ENABLED for k in keys)
            assert peak < ROWS * PAYLOAD_CHARS / 2, f"peak {peak / 2**20:.0f} MiB"

            # A clock that steps back moves next slots, and reads no row.
            def no_read(*_: object, **__: object) -> None:
                raise AssertionError("rows read again")

            monkeypatch.setattr(changes, "stream_rows", no_read)
            monkeypatch.setattr(changes, "read_rows", no_read)
            back = NOW - timedelta(minutes=5)
            keys = await order.snapshot(conn, back, rules)
            assert {k[1] for k in keys} == {back.replace(second=0) + timedelta(minutes=1)}
    finally:
        await engine.dispose()
