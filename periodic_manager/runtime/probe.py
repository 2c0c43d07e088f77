"""Liveness and readiness signals of a running process.

**Probe file.** A process that schedules (``manager``, ``run``) and has ``PM_PROBE_DIR`` set
writes ``<PM_PROBE_DIR>/<role>.json`` every ``PM_PROBE_INTERVAL`` seconds from a task on its own
event loop::

    {"role": "manager", "pid": 4242, "at": "2026-12-01T10:00:00.5Z", "interval_s": 5.0,
     "status": "ok", "reason": null}

A blocked or dead event loop stops the writes, so the file goes stale; a manager that reports
itself unhealthy (a supervised loop died, ...) writes ``"status": "unhealthy"`` with the reason.
``periodic-manager health`` (:func:`check_probe`) reads the file and exits non-zero when it is
missing, stale, written in the future or unhealthy: an ``exec`` liveness probe for a process that
serves no HTTP. A probe ahead of the reader's clock is never "fresh": after the clock steps back a
frozen process would otherwise look alive until the clock caught up with its last write.

Only a regular file of at most :data:`MAX_PROBE_BYTES` is read: a FIFO or a link to a device in
its place must not make the probe hang (a FIFO without a writer blocks an open for reading) or
read without end (``/dev/zero``).

**Target check.** :func:`ping_target` asks a target whether its broker answers (used by
``/readyz``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from periodic_manager.clock import next_tick
from periodic_manager.contracts import Clock, ManagerHandle, Pingable, Target
from periodic_manager.errors import cause

log = logging.getLogger(__name__)

# None when healthy, else why not (one line).
HealthCheck = Callable[[], str | None]
DEFAULT_MAX_AGE_S = 30.0
# A probe written further ahead of the reader's clock than this: the clocks disagree, or the clock
# stepped back (and a frozen writer would look fresh until it caught up). Writer and reader share
# the host's clock, so a few seconds cover any slew.
MAX_SKEW_S = 5.0
MAX_PROBE_BYTES = 64 * 1024  # the file is ~150 bytes; a larger one is not ours


def manager_health(manager: ManagerHandle) -> HealthCheck:
    """The health check of a manager: its own ``health()``."""
    return manager.health


def ensure_writable(directory: str | os.PathLike[str]) -> None:
    """Create ``directory`` if needed and prove a file can be written there (raises OSError)."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    test = path / f".write-test.{os.getpid()}"
    test.write_text("")
    test.unlink()


def probe_path(directory: str | os.PathLike[str], role: str) -> Path:
    return Path(directory) / f"{role}.json"


def _instant_text(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


class ProbeWriter:
    """Writes the probe file of ``role`` every ``interval_s`` while the loop it runs on is alive."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        role: str,
        health: HealthCheck,
        *,
        clock: Clock,
        interval_s: float = 5.0,
    ) -> None:
        self.path = probe_path(directory, role)
        self.role = role
        self.health = health
        self.clock = clock
        self.interval_s = interval_s
        self._last_error: str | None = None

    def write(self) -> None:
        """Write the file once (atomically: readers never see half a file). Raises OSError."""
        try:
            reason = self.health()
        except Exception as exc:  # a broken check is itself a reason not to look alive
            reason = f"health check failed: {exc!r}"
        doc = {
            "role": self.role,
            "pid": os.getpid(),
            "at": _instant_text(self.clock.now()),
            "interval_s": self.interval_s,
            "status": "ok" if reason is None else "unhealthy",
            "reason": reason,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)

    async def run(self) -> None:
        """Write every ``interval_s`` until cancelled. A failed write is logged (once per kind of
        error) and retried at the next tick: the file going stale is the signal."""
        while True:
            try:
                self.write()
                if self._last_error is not None:
                    log.info("probe file %s written again", self.path)
                    self._last_error = None
            except OSError as exc:
                text = cause(exc)
                if text != self._last_error:
                    log.error("cannot write the probe file %s: %s", self.path, text)
                self._last_error = text
            await self.clock.sleep_until(next_tick(self.clock.now(), self.interval_s))

    def remove(self) -> None:
        """Remove the file (a clean stop): a stopped process is not "alive but stale"."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove the probe file %s: %s", self.path, cause(exc))


@dataclass(frozen=True)
class ProbeVerdict:
    ok: bool
    line: str


def check_probe(
    directory: str | os.PathLike[str], role: str, now: datetime, max_age_s: float | None = None
) -> ProbeVerdict:
    """Judge the probe file of ``role`` at ``now``. ``max_age_s`` None: three write intervals as
    the file states them, at least :data:`DEFAULT_MAX_AGE_S`."""
    path = probe_path(directory, role)
    try:
        doc = json.loads(read_probe(path).decode("utf-8"))
        at = datetime.fromisoformat(str(doc["at"]).replace("Z", "+00:00"))
        interval = float(doc.get("interval_s") or 0)
        if not (math.isfinite(interval) and interval >= 0):
            raise ValueError(f"'interval_s' is not a number of seconds: {interval}")
        status = str(doc.get("status"))
    except FileNotFoundError:
        return ProbeVerdict(
            False, f"missing: no probe file {path} (is PM_PROBE_DIR set for the {role}?)"
        )
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        return ProbeVerdict(False, f"unreadable: probe file {path}: {exc}")
    if at.tzinfo is None:
        return ProbeVerdict(False, f"unreadable: probe file {path}: 'at' has no offset")
    limit = max_age_s if max_age_s is not None else max(DEFAULT_MAX_AGE_S, 3 * interval)
    age = (now - at).total_seconds()
    pid = doc.get("pid")
    if -age > MAX_SKEW_S:
        return ProbeVerdict(
            False,
            f"clock skew: {role} (pid {pid}) wrote its probe {-age:.1f} s in the future "
            f"(max {MAX_SKEW_S:g} s): the clock stepped back, or the clocks disagree",
        )
    if age > limit:
        return ProbeVerdict(
            False,
            f"stale: {role} (pid {pid}) last wrote its probe {age:.1f} s ago (max {limit:g} s)",
        )
    if status != "ok":
        return ProbeVerdict(False, f"unhealthy: {role} (pid {pid}): {doc.get('reason')}")
    return ProbeVerdict(True, f"ok: {role} (pid {pid}) wrote its probe {max(age, 0):.1f} s ago")


def read_probe(path: Path) -> bytes:
    """The bytes of the probe file, if it is a regular file (a link to one is followed) of at
    most :data:`MAX_PROBE_BYTES`; ValueError otherwise, OSError when it cannot be read."""
    _regular(os.stat(path).st_mode)  # nothing else is even opened
    # O_NONBLOCK: should the path become a FIFO between the stat and the open, the open must
    # not wait for a writer; what was opened is then judged again.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as file:
        _regular(os.fstat(fd).st_mode)
        data = file.read(MAX_PROBE_BYTES + 1)
    if len(data) > MAX_PROBE_BYTES:
        raise ValueError(f"larger than {MAX_PROBE_BYTES} bytes: not a probe file")
    return data


def _regular(mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else None
        raise ValueError(f"not a regular file ({kind or 'a device or socket'})")


async def ping_target(target: Target, timeout_s: float) -> None:
    """Raise unless ``target``'s broker answers within ``timeout_s``. A target that is not
    :class:`~periodic_manager.contracts.Pingable` (an in-memory one, a custom one) counts as
    reachable."""
    if not isinstance(target, Pingable):
        return
    async with asyncio.timeout(timeout_s):
        await target.ping()


async def ping_each(targets: Mapping[str, Target], timeout_s: float) -> dict[str, Exception]:
    """Ping every one of ``targets`` at once (:func:`ping_target`, each within ``timeout_s``);
    the ones that did not answer, by name, with the error. A cancellation is raised, never
    counted as a target's failure."""
    outcomes = await asyncio.gather(
        *(ping_target(t, timeout_s) for t in targets.values()), return_exceptions=True
    )
    failed: dict[str, Exception] = {}
    for name, outcome in zip(targets, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, Exception):
                raise outcome
            failed[name] = outcome
    return failed
