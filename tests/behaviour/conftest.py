"""Fixtures of the behaviour tests: throwaway ``redis-server`` processes to kill, freeze and
restart (tests/support/servers.py), always stopped afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
