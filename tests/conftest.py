"""Shared fixtures: fresh PostgreSQL databases, SQLite files and Redis key prefixes per test.

Tests talk to real services (PM_TEST_PG_DSN, PM_TEST_REDIS_URL; defaults: the local ones). A
service that cannot be reached skips its tests locally, and fails them under CI=true.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
import redis.asyncio as aioredis

from periodic_manager.db.migrate import upgrade

PG_DSN = os.environ.get("PM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432")
REDIS_URL = os.environ.get("PM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
IN_CI = os.environ.get("CI", "").lower() == "true"


def _unavailable(what: str, exc: BaseException) -> None:
    msg = f"{what} unreachable: {exc!r}"
    if IN_CI:
        pytest.fail(msg + " (CI=true: a missing service is a failure)", pytrace=False)
    pytest.skip(msg)


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    """URL of a new, empty PostgreSQL database, dropped after the test."""
    name = f"pm_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = await asyncpg.connect(f"{PG_DSN}/postgres", timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        _unavailable("PostgreSQL", exc)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield f"{PG_DSN.replace('postgresql://', 'postgresql+asyncpg://')}/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
def sqlite_url(tmp_path: object) -> str:
    return f"sqlite+aiosqlite:///{tmp_path}/pm.db"  # type: ignore[str-bytes-safe]


@pytest.fixture(params=["postgresql", "sqlite"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def empty_db_url(backend: str, request: pytest.FixtureRequest) -> str:
    """An empty database on each backend (the test is run once per backend)."""
    fixture = "pg_url" if backend == "postgresql" else "sqlite_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
async def db_url(empty_db_url: str) -> str:
    """A database migrated to head, on each backend."""
    await upgrade(empty_db_url)
    return empty_db_url


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix unique to the test; every key the test makes contains it."""
    return f"pmt{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def redis_client(redis_prefix: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(REDIS_URL, decode_responses=True)
    try:
        await client.ping()
    except (OSError, aioredis.RedisError) as exc:
        await client.aclose()
        _unavailable("Redis", exc)
    try:
        yield client
    finally:
        keys = [k async for k in client.scan_iter(match=f"*{redis_prefix}*", count=1000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()


@pytest.fixture
def redis_url() -> Iterator[str]:
    yield REDIS_URL
