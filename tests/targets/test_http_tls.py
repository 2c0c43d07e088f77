"""TLS is verified: a receiver whose certificate a private CA signed is refused (and retried)
until ``PM_HTTP_CA_BUNDLE`` names that CA; then delivered. The CA and the certificate are made
by the openssl command for the test."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.clock import VirtualClock
from periodic_manager.db.engine import create_engine
from periodic_manager.db.models import http_deliveries_table as table
from tests.targets.http_receiver import Receiver
from tests.targets.test_http_target import FAST, START, Delivering, all_in, task, until


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture
def certificates(tmp_path: Path) -> tuple[Path, Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "2", "-subj", "/CN=pm test CA", cwd=tmp_path)  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
            "server.csr", "-subj", "/CN=127.0.0.1", cwd=tmp_path)  # fmt: skip
    (tmp_path / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "san.ext",
            cwd=tmp_path)  # fmt: skip
    return tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key"


@pytest.fixture
async def engine(migrated_pg_url: str) -> AsyncIterator[AsyncEngine]:
    e = create_engine(migrated_pg_url)
    yield e
    await e.dispose()


async def test_a_private_ca_is_trusted_only_when_named(
    engine: AsyncEngine, certificates: tuple[Path, Path, Path]
) -> None:
    ca, cert, key = certificates
    receiver = Receiver(tls=(str(cert), str(key)))
    await receiver.start()
    try:
        clock = VirtualClock(START)
        untrusting = Delivering(engine, clock, "m1")
        await untrusting.target.enqueue([task("tls.a", START, receiver.url, retry=FAST)], START)
        await until(clock, lambda: untrusting.target.delivery_counts()["retried"] >= 2, step=5)
        await untrusting.stop()
        assert receiver.requests == []  # the handshake failed: nothing reached the receiver
        async with engine.connect() as conn:
            error = (await conn.execute(select(table.c.last_error))).scalar()
        assert "CERTIFICATE_VERIFY_FAILED" in str(error), error
        trusting = Delivering(engine, clock, "m2", ca_bundle=str(ca), lease_margin=0.1)
        await until(clock, lambda: all_in(engine, "done", 1), step=5)
        await trusting.stop()
    finally:
        await receiver.stop()
    assert len(receiver.processed) == 1
