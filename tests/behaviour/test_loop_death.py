"""A supervised loop that dies takes the process down loudly (issue: "a dead loop goes
unnoticed"): a real ``periodic-manager manager`` process whose sync loop is made to fail exits
non-zero within seconds, with one line naming the loop and the cause, and no traceback."""

from __future__ import annotations

import subprocess
import sys
import time

from periodic_manager.db.migrate import upgrade
from tests.support import ROOT

# The manager command, with one fault injected: every sync after the first (the one start()
# runs) raises. Nothing else is changed.
LAUNCHER = """
import sys
from periodic_manager.runtime.sync import Syncer
calls = []
original = Syncer.sync
async def faulty(self, *, full=False):
    calls.append(1)
    if len(calls) > 1:
        raise RuntimeError("injected fault in the sync loop")
    return await original(self, full=full)
Syncer.sync = faulty
from periodic_manager.cli.main import main
sys.exit(main(["manager"]))
"""


async def test_a_manager_whose_sync_loop_dies_exits_non_zero_with_one_line(sqlite_url: str) -> None:
    await upgrade(sqlite_url)
    env = {"PM_DATABASE_URL": sqlite_url, "PM_SYNC_INTERVAL": "0.2", "PATH": "/usr/bin:/bin"}
    started = time.monotonic()
    proc = subprocess.run(  # noqa: ASYNC221 - a child process with a bound, not a slot wait
        [sys.executable, "-c", LAUNCHER],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert lines[-1] == (
        "periodic-manager: error: periodic-manager-sync-loop died: "
        "RuntimeError: injected fault in the sync loop"
    )
    assert "Traceback" not in proc.stderr
    assert took < 30  # not a crash loop, not a hang: it noticed within its 1 s supervision
