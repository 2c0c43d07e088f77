"""Fixtures of the API tests: a virtual clock at T0, an engine on the migrated database of each
backend (``db_url``), and a client of the app with its lifespan run (tests/support/api.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.clock import VirtualClock
from periodic_manager.db.engine import create_engine
from tests.support.api import T0, api_client


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(T0)


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_engine(db_url)
    try:
        yield eng
    finally:
        await eng.dispose()


@pytest.fixture
async def client(
    db_url: str, engine: AsyncEngine, clock: VirtualClock
) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(db_url, clock, engine) as c:
        yield c
