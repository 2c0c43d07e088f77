"""The example plugin (examples/target_plugin), pip-installed into a folder of its own, and run by
an unmodified manager: ``PM_TARGET=jsonl`` is all it takes, and every slot is one line of the
file however many managers send it, and across a manager killed and started again."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "periodic_manager"]


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip install examples/target_plugin`` into a folder put on the managers' PYTHONPATH
    (the test venv is left as it is). No build isolation: the venv's setuptools and wheel. Built
    from a copy, since setuptools writes its build/ and egg-info/ beside the sources."""
    site = tmp_path_factory.mktemp("plugin_site")
    build = tmp_path_factory.mktemp("plugin_build")
    source = shutil.copytree(ROOT / "examples/target_plugin", build / "target_plugin")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
        + ["--no-build-isolation", "--target", str(site), str(source)],
        check=True,
        cwd=build,
        capture_output=True,
        env={**os.environ, "PIP_CONFIG_FILE": os.devnull},
    )
    return site


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def wait_lines(path: Path, count: int, procs: list[asyncio.subprocess.Process]) -> None:
    async with asyncio.timeout(30):
        while len(lines_of(path)) < count:
            for proc in procs:
                assert proc.returncode is None, f"a manager exited ({proc.returncode})"
            await asyncio.sleep(0.1)


async def start(command: str, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *CLI, command, env=env, stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL
    )


async def api_port(proc: asyncio.subprocess.Process) -> int:
    assert proc.stderr is not None
    seen = []
    async with asyncio.timeout(30):
        while True:
            line = (await proc.stderr.readline()).decode()
            assert line, "run exited: " + "".join(seen)
            seen.append(line)
            if found := re.search(r"API on http://127\.0\.0\.1:(\d+)", line):
                assert "target jsonl (file " in line, line  # the plugin's own `where`
                return int(found.group(1))


async def stop(proc: asyncio.subprocess.Process, sig: int = signal.SIGTERM) -> None:
    if proc.returncode is None:
        proc.send_signal(sig)
    await asyncio.wait_for(proc.communicate(), 30)


async def test_an_unmodified_manager_runs_the_jsonl_plugin_once_per_slot(
    plugin_site: Path, tmp_path: Path
) -> None:
    path = tmp_path / "tasks.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PM_")}
    env.update(
        PYTHONPATH=str(plugin_site),
        PM_TARGET="jsonl",
        PM_JSONL_PATH=str(path),
        PM_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path}/pm.db",
        PM_PORT="0",
        PM_SYNC_INTERVAL="1",
    )
    first = await start("run", env)
    procs = [first]
    try:
        port = await api_port(first)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            body = {"name": "tick", "spec": "@every 1s", "task_type": "jsonl.tick"}
            # The plugin's write-time rule, and its lack of a completion signal: 422s.
            refused = await client.post("/schedules", json={**body, "payload": [1]})
            assert refused.status_code == 422 and "JSON objects" in refused.text, refused.text
            overlap = {**body, "payload": {}, "options": {"overlap": "skip"}}
            refused = await client.post("/schedules", json=overlap)
            assert refused.status_code == 422 and "whether its task finished" in refused.text
            created = await client.post("/schedules", json={**body, "payload": {"n": 1}})
            assert created.status_code == 201, created.text
        # A second manager on the same database sends every slot too (SQLite: no election).
        procs.append(await start("manager", env))
        await wait_lines(path, 4, procs)
        await stop(procs.pop(), signal.SIGKILL)  # killed mid-way, then started again
        procs.append(await start("manager", env))
        await wait_lines(path, 9, procs)
    finally:
        for proc in procs:
            await stop(proc)
    lines = lines_of(path)
    keys = [line["idempotency_key"] for line in lines]
    assert len(keys) == len(set(keys)), "a slot was written twice"
    slots = sorted(datetime.fromisoformat(line["scheduled_at"]) for line in lines)
    assert slots == [slots[0] + timedelta(seconds=i) for i in range(len(slots))], slots
    assert {(line["task_type"], json.dumps(line["payload"])) for line in lines} == {
        ("jsonl.tick", '{"n": 1}')
    }


def test_an_unknown_target_is_one_line_naming_the_installed_ones(plugin_site: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PM_")}
    env.update(PYTHONPATH=str(plugin_site), PM_TARGET="sqs")
    done = subprocess.run([*CLI, "migrate"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("periodic-manager: error: --target / PM_TARGET: ")
    assert (
        "unknown target 'sqs': the installed targets are arq, asynq, celery, dramatiq, http, jsonl,"
        in line
    )
