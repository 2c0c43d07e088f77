"""Fixtures of the runtime tests: a PostgreSQL reached through a proxy the test can cut."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.engine import make_url

from tests.support.tcpproxy import TcpProxy


def dsn(url: str) -> str:
    """An asyncpg DSN of a SQLAlchemy PostgreSQL URL."""
    return url.replace("postgresql+asyncpg://", "postgresql://")


@pytest.fixture
async def proxied(pg_url: str) -> AsyncIterator[tuple[str, TcpProxy]]:
    """A DSN of ``pg_url``'s database through a TcpProxy, and the proxy."""
    u = make_url(pg_url)
    proxy = TcpProxy(u.host or "127.0.0.1", u.port or 5432)
    port = await proxy.start()
    try:
        yield dsn(u.set(port=port).render_as_string(hide_password=False)), proxy
    finally:
        await proxy.close()
