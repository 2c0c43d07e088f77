"""The suite's own Redis hygiene: a test run that leaves a key in the test Redis fails, naming it;
the keys a test writes under its ``redis_prefix`` go with the test; keys of another run sharing
the Redis are none of this run's business.

An inner pytest run (a subprocess, with this suite's ``conftest.py``) plays the leaking suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from tests.conftest import _unavailable
from tests.support import ROOT
from tests.support.servers import RedisServer

INNER = """
import redis

from tests.conftest import REDIS_URL

client = redis.Redis.from_url(REDIS_URL)


def test_writes_under_its_prefix(redis_prefix):
    open("prefix.txt", "w").write(redis_prefix)  # for the outer test to look for afterwards
    client.set(f"{redis_prefix}:claim:x", 1)
    client.rpush(f"_kombu.binding.{redis_prefix}.q", "x")  # not a prefix, but it contains it


def test_another_run_writes_meanwhile():
    client.set("pmtffffffffffff:TAG:other-run", 1)


def test_leaks_a_default_key():
    client.set("pm:claim:TAG", 1)
"""

# The same run on two pytest-xdist workers, one file each (``--dist loadfile``), each in a Redis
# database of its own: worker b's first test has begun (and so its session) before worker a leaks
# the key, and b's tests end after it. Both workers' sessions span the leak; the run must report
# it once. (A worker runs a test once it knows the next, so each file ends with a test that waits
# for nothing.)
XDIST_HEAD = """
import time
from pathlib import Path

import redis

from tests.conftest import REDIS_URL

client = redis.Redis.from_url(REDIS_URL)


def wait_for(condition, what):
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within 30 s"
        time.sleep(0.05)
"""
INNER_XDIST_A = (
    XDIST_HEAD
    + """

def test_leaks_a_default_key():
    wait_for(lambda: Path("b-started").exists(), "worker b's start")
    Path("a-db.txt").write_text(REDIS_URL)
    client.set("pm:claim:TAG", 1)
    Path("a-leaked").touch()


def test_nothing_after():
    pass
"""
)
INNER_XDIST_B = (
    XDIST_HEAD
    + """

def test_writes_under_its_prefix(redis_prefix):
    open("prefix.txt", "w").write(redis_prefix)
    client.set(f"{redis_prefix}:claim:x", 1)
    client.rpush(f"_kombu.binding.{redis_prefix}.q", "x")
    Path("b-db.txt").write_text(REDIS_URL)
    Path("b-started").touch()
    wait_for(lambda: Path("a-leaked").exists(), "the leak")


def test_another_run_writes_meanwhile():
    client.set("pmtffffffffffff:TAG:other-run", 1)
"""
)


# A hang guard, not a bound: the inner run starts a pytest (and for xdist two workers) that
# import the whole package, which took over 100 s on a loaded 2-core machine.
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("files", "options"),
    [
        ({"test_inner.py": INNER}, ["-n", "0"]),  # the suite runs on workers unless told
        (
            {"test_inner_a.py": INNER_XDIST_A, "test_inner_b.py": INNER_XDIST_B},
            ["-n", "2", "--dist", "loadfile"],
        ),
    ],
    ids=["one-process", "xdist"],
)
def test_a_run_that_leaves_a_key_fails_and_names_only_that_key(
    tmp_path: Path, files: dict[str, str], options: list[str]
) -> None:
    """In one process the session fixture checks; on pytest-xdist workers (each in a Redis
    database of its own, 15 and 14) the controller checks them all once every worker has finished,
    and reports it the same way. The inner run has a Redis server of its own: this run's tests on
    other workers write meanwhile."""
    try:
        server = RedisServer(persist=False)
        server.start()
        dbs = [15, 14] if "2" in options else [15]
        clients = [
            redis.Redis.from_url(f"redis://127.0.0.1:{server.port}/{db}", socket_connect_timeout=2)
            for db in dbs
        ]
        clients[0].ping()
    except (RuntimeError, OSError, redis.RedisError) as exc:
        _unavailable("redis-server", exc)
    tag = uuid.uuid4().hex[:12]
    suite = tmp_path / "tests"
    suite.mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", suite / "conftest.py")
    (suite / "__init__.py").write_text("")
    for name, text in files.items():
        (suite / name).write_text(text.replace("TAG", tag))
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    leaked, other = f"pm:claim:{tag}", f"pmtffffffffffff:{tag}:other-run"
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-rN",
                "-p",
                "no:cacheprovider",
                *options,
                "tests",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=280,
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")},
                "PM_TEST_REDIS_URL": f"redis://127.0.0.1:{server.port}/15",
            },
        )
        out = done.stdout + done.stderr
        assert done.returncode == 1, out
        tests = sum(text.count("\ndef test_") for text in files.values())
        assert f"{tests} passed, 1 error" in out, out
        line = next(ln for ln in out.splitlines() if "left 1 key(s) in the test Redis" in ln)
        assert f": {leaked}. A test must" in line, out  # the leak, and nothing else
        # the guard reports; it deletes nothing
        assert sum(client.exists(leaked, other) for client in clients) == 2
        prefix = (tmp_path / "prefix.txt").read_text()
        assert prefix.startswith("pmt"), prefix
        for client in clients:
            assert not list(client.scan_iter(match=f"*{prefix}*")), "the prefix's keys went"
        if "2" in options:  # each worker wrote to a database of its own
            used = {(tmp_path / f"{w}-db.txt").read_text().rsplit("/", 1)[1] for w in "ab"}
            assert used == {"15", "14"}, used
    finally:
        for client in clients:
            client.delete(leaked, other)
            client.close()
        server.close()
