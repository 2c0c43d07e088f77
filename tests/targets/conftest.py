"""Fixtures of the target tests: the throwaway Redis Cluster (started on first use, once), and
an arq target on the test Redis whose jobs' keys go with the test (list their ids in
``target.made``)."""

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from periodic_manager.targets.arq import ArqTarget
from tests.support.cluster import redis_cluster  # noqa: F401  (a fixture)


@pytest.fixture
async def arq_target(
    redis_url: str, redis_prefix: str, redis_client: aioredis.Redis
) -> AsyncIterator[ArqTarget]:
    target = ArqTarget.from_url(redis_url, prefix=redis_prefix)
    made: list[str] = []
    target.made = made  # type: ignore[attr-defined]
    yield target
    await target.close()
    keys = [f"arq:{kind}:{i}" for i in made for kind in ("job", "in-progress", "result", "retry")]
    if keys:
        await redis_client.delete(*keys)
