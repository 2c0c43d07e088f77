"""Fixtures of the behaviour tests: throwaway ``redis-server`` processes to kill, freeze and
restart (tests/support/servers.py), always stopped afterwards; the API with a real manager in its
process on each (database, target) pair (``rig``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import datetime

import pytest

from tests.conftest import backend_url
from tests.support.e2e import T0, Rig, e2e_rig
from tests.support.servers import RedisServer


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A private Redis with an append-only file, fsynced: a SIGKILL keeps what was written."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def forgetful() -> Iterator[RedisServer]:
    """A private Redis without persistence: after a restart it answers, empty (a cache
    deployment, a failover to an empty replica)."""
    with RedisServer(persist=False) as server:
        yield server


@pytest.fixture(params=["postgresql+redis", "postgresql+outbox", "sqlite+outbox", "mysql+outbox"])
def combo(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(URL of a database migrated to head, target); async fixtures are pulled in from this
    sync fixture."""
    backend, target = str(request.param).split("+")
    if target == "redis":
        request.getfixturevalue("redis_client")  # cleans the test's keys afterwards
    return backend_url(request, backend, migrated=True), target


@pytest.fixture
def rig_start() -> datetime:
    """When the ``rig``'s virtual clock starts (a test module may override this fixture)."""
    return T0


@pytest.fixture
async def rig(
    combo: tuple[str, str], redis_prefix: str, redis_url: str, rig_start: datetime
) -> AsyncIterator[Rig]:
    url, target = combo
    async for r in e2e_rig(url, target, redis_prefix, redis_url, start=rig_start):
        yield r
