"""A throwaway Redis Cluster of three masters (no replicas), loopback only, always stopped.

Each node is a ``redis-server --cluster-enabled yes`` on a free 127.0.0.1 port without any
persistence (``--save '' --appendonly no``), its ``nodes-<port>.conf`` in one temporary directory;
``redis-cli --cluster create`` joins them and shares the 16384 slots out. A node killed and
started again (:meth:`RedisCluster.restart_empty`) keeps its place in the cluster (the nodes
file) but none of its data: a master that forgot everything.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import _unavailable
from tests.support.servers import Throwaway, _accepting


def cluster_port() -> int:
    """A port free on 127.0.0.1 with its cluster bus port (+10000) free too; at most 55535."""
    for _ in range(200):
        port = random.randint(20000, 45000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free pair of ports for a cluster node")


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not on PATH")
    return found


class RedisCluster(Throwaway):
    """Three cluster masters; :meth:`start` builds the cluster, :meth:`close` stops every node."""

    def __init__(self, masters: int = 3) -> None:
        self.server = _binary("redis-server")
        self.cli = _binary("redis-cli")
        self.dir = Path(tempfile.mkdtemp(prefix="pm-cluster-"))
        self.ports = [cluster_port() for _ in range(masters)]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """A URL of one node (any node is enough: the client reads the topology)."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def _spawn(self, port: int, timeout: float = 10.0) -> None:
        proc = subprocess.Popen(
            [
                self.server,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(self.dir / f"nodes-{port}.conf"),
                "--cluster-node-timeout",
                "2000",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.procs[port] = proc
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server (cluster node {port}) exited with {proc.returncode}"
                )
            if _accepting(port):
                return
            time.sleep(0.02)
        raise RuntimeError(f"cluster node {port} did not answer within {timeout} s")

    def cli_run(self, port: int, *args: str, timeout: float = 60.0) -> str:
        """``redis-cli -p <port> <args>``; its output, or RuntimeError naming it."""
        done = subprocess.run(
            [self.cli, "-h", "127.0.0.1", "-p", str(port), *args],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        out = (done.stdout + done.stderr).decode(errors="replace")
        if done.returncode != 0 or out.startswith("ERR") or "[ERR]" in out:
            raise RuntimeError(
                f"redis-cli {' '.join(args)} exited with {done.returncode}: {out[-2000:]}"
            )
        return out

    def start(self, timeout: float = 30.0) -> None:
        for port in self.ports:
            self._spawn(port)
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        subprocess.run(
            [self.cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            timeout=60,
            check=True,
        )
        self.wait_ok(timeout)

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every node says ``cluster_state:ok`` (a bounded poll)."""
        deadline = time.monotonic() + timeout
        while True:
            states = [self.cli_run(port, "cluster", "info") for port in self.ports]
            if all("cluster_state:ok" in state for state in states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster is not ok within {timeout} s: {states}")
            time.sleep(0.05)

    def node_id(self, port: int) -> str:
        return self.cli_run(port, "cluster", "myid").strip()

    def restart_empty(self, port: int) -> None:
        """SIGKILL one master and start it again: same nodes file (its slots), no data."""
        proc = self.procs[port]
        proc.kill()
        proc.wait(10)
        self._spawn(port)
        self.wait_ok()

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """One cluster of three masters for the session (started on first use). A missing
    redis-server or redis-cli skips its tests locally and fails them under CI=true."""
    try:
        cluster = RedisCluster()
    except RuntimeError as exc:
        _unavailable("Redis Cluster", exc)  # fails under CI=true, skips elsewhere
    with cluster:
        yield cluster
