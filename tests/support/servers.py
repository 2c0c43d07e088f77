"""Throwaway servers for fault-injection tests and benchmarks: loopback only, always stopped.

:class:`RedisServer` runs a private ``redis-server`` on a free 127.0.0.1 port with an append-only
file fsynced on every write, so a SIGKILL followed by :meth:`RedisServer.start` on the same port
keeps the streams and the claims (what a restarted production Redis with AOF would keep).
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

from tests.support import ROOT

# Throwaway ports come from a block of this process's own, below the kernel's ephemeral range
# (32768-60999 on Linux), so that no other xdist worker's free_port, nor a port the kernel picks
# for an outgoing connection or a bind to port 0, takes a port a test let go of a moment (a
# server killed and started again on the same port, a proxy cut and restored, a port closed on
# purpose). Worker gwN has ports 20000 + 500 N up to 500 further, from a random start.
_PORTS_PER_WORKER = 500
_FIRST_PORT = 20000


def _port_block() -> Iterator[int]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") else 0
    block = range(
        _FIRST_PORT + _PORTS_PER_WORKER * index, _FIRST_PORT + _PORTS_PER_WORKER * (index + 1)
    )
    start = random.randrange(len(block))  # another run at the same time starts elsewhere
    return itertools.cycle([*block[start:], *block[:start]])


_ports = _port_block()


def free_port() -> int:
    """A TCP port of this process's block that is free on 127.0.0.1 right now."""
    for _ in range(_PORTS_PER_WORKER):
        port = next(_ports)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port left in this process's block of {_PORTS_PER_WORKER}")


def _accepting(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class Throwaway:
    """A service a test starts and stops: as a context manager it is started, and stopped with
    its files removed however the block ends (a start that fails half-way included)."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RedisServer(Throwaway):
    """A ``redis-server`` process the caller kills, freezes and restarts at will.

    Use as a context manager (or call :meth:`close`): the process is stopped and its directory
    removed whatever happened.
    """

    def __init__(self, port: int | None = None, *, persist: bool = True) -> None:
        """``persist=False``: no append-only file, so a restart comes back empty (a Redis that
        forgets, as a cache deployment or a failover to an empty replica does)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH")
        self.binary = binary
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="pm-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.persist = persist

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        """Start (or restart, same port and data directory) and wait until it answers PING."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("already running")
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes" if self.persist else "no",
                "--appendfsync",
                "always",
                "--dir",
                str(self.dir),
                "--protected-mode",
                "yes",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            if _accepting(self.port):
                return
            time.sleep(0.02)
        self.close()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout} s")

    def kill(self) -> None:
        """SIGKILL: the server vanishes; clients see their connections reset."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def freeze(self) -> None:
        """SIGSTOP: the kernel still accepts connections and buffers requests; nothing answers."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        self.kill()  # SIGKILL ends a stopped (frozen) process too
        shutil.rmtree(self.dir, ignore_errors=True)


class ManagerProcess:
    """A ``python -m periodic_manager manager`` subprocess; its log goes to a file (no pipe fills)."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PM_")} | env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "periodic_manager", "manager"],
                env=self.env,
                stdout=log,
                stderr=log,
                cwd=ROOT,
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye; the database ends its sessions."""
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit within ``timeout``; the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def _postgres_binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
        if not versions:
            raise RuntimeError(f"{name} is not on PATH nor under /usr/lib/postgresql")
        found = str(versions[-1])
    return found


class PostgresServer(Throwaway):
    """A private PostgreSQL cluster (initdb + pg_ctl) on a free 127.0.0.1 port that requires a
    password (scram-sha-256) even on loopback, unlike the shared test server (trust).

    As root the cluster runs as the ``postgres`` user (PostgreSQL refuses to run as root). Use as
    a context manager: the server is stopped and its directory removed whatever happened.
    """

    def __init__(self, password: str = "right-password") -> None:
        self.password = password
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="pm-pg-"))
        self.data = self.dir / "data"
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            self._as_user = ["runuser", "-u", "postgres", "--"]
        self.started = False

    def url(self, password: str | None = None, database: str = "postgres") -> str:
        secret = self.password if password is None else password
        return f"postgresql://postgres:{secret}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> None:
        done = subprocess.run(
            [*self._as_user, *args], capture_output=True, timeout=60, cwd=self.dir
        )
        if done.returncode != 0:
            output = (done.stdout + done.stderr).decode(errors="replace").strip()[-2000:]
            raise RuntimeError(f"{Path(args[0]).name} exited with {done.returncode}: {output}")

    def start(self) -> None:
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        if self._as_user:
            shutil.chown(pwfile, "postgres")
        self._run(
            _postgres_binary("initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--auth=scram-sha-256",
            f"--pwfile={pwfile}",
            "--no-sync",
        )
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            _postgres_binary("pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-w",
            "-l",
            str(self.dir / "log"),
            "start",
        )
        self.started = True

    def close(self) -> None:
        if self.started:
            try:
                self._run(
                    _postgres_binary("pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"
                )
            finally:
                self.started = False
        shutil.rmtree(self.dir, ignore_errors=True)
