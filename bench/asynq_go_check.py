"""A real, unmodified Go ``asynq.Server`` runs the tasks the asynq target writes; asynq's Inspector
reads the scheduler entries and the enqueue history the manager publishes.

A fresh PostgreSQL database (on the server of PM_TEST_PG_DSN) is migrated with
``periodic-manager migrate``; five ``@every 1s`` schedules are inserted (see SCHEDULES: queues,
max_retry, timeout, extra.deadline, extra.retention, unique_ttl, overlap=skip; a JSON object, a
JSON string, a number, no payload); a ``periodic-manager manager`` process (PM_TARGET=asynq) sends for
``--seconds`` while the Go worker of examples/asynq_worker serves both queues (the type
``demo:fail`` always fails: asynq retries it, then archives it; ``demo:slow`` takes 2.5 s). Midway, the worker's ``inspect``
mode (asynq's Inspector) lists the scheduler entries; after the manager stops and the worker has
drained, it lists every task by state and each schedule's enqueue history.

Checked: every slot the manager recorded ``enqueued`` in pm_runs was run by the worker exactly
once (the failing type: max_retry + 1 times, retry counts 0..max_retry), with the expected type,
payload, queue, max retry and task id (the idempotency key ``<name>:<slot UTC>``); no run of a
task that was not recorded; the final states (``completed`` with the retention, deleted without
one, ``archived`` after the retries); the entries (id, spec, type, payload, options, next after
prev) and the history (one event per task sent); overlap=skip against the server's task states
(runs never overlap, slots skipped); asynq's own Client against the manager's task ids and
uniqueness lock. Needs the built worker binary::

    cd examples/asynq_worker && go build -o /tmp/asynq_worker .
    PM_ASYNQ_WORKER=/tmp/asynq_worker PM_TEST_REDIS_URL=redis://127.0.0.1:6379/2 \\
        .venv/bin/python bench/asynq_go_check.py [--seconds 15] [--out bench/asynq_go_check.txt]

(``--asynq-version v0.24.1`` when the binary was built without modules, GOPATH style: it then
carries no module versions; ``--append`` adds the run to ``--out``.)

The Redis database of PM_TEST_REDIS_URL is flushed before and after: give it one of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

import asyncpg
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.asynq_go_verdicts import (  # noqa: E402
    FAIL_TYPE,
    QUEUES,
    SCHEDULES,
    SLOW_S,
    SLOW_TYPE,
    UNIQUE_LOCK,
    check_client,
    check_entries,
    check_history,
    check_overlap,
    check_pause,
    check_runs,
    check_unique,
)
from periodic_manager.schedules.definition import idempotency_key  # noqa: E402
from periodic_manager.targets.asynq.message import unique_key  # noqa: E402
from tests.support.servers import ManagerProcess  # noqa: E402

PG_DSN = os.environ.get("PM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432")
REDIS_URL = os.environ.get("PM_TEST_REDIS_URL", "redis://127.0.0.1:6379/2")


def worker_binary() -> str:
    path = os.environ.get("PM_ASYNQ_WORKER", "")
    if not path or not os.access(path, os.X_OK):
        sys.exit("PM_ASYNQ_WORKER must name the built examples/asynq_worker binary")
    return path


def inspect(binary: str, redis_url: str, history: str = "") -> dict[str, Any]:
    """One run of the worker's inspect mode (asynq's Inspector): its JSON document."""
    args = [binary, "inspect", "-redis", redis_url, "-queues", QUEUES, "-history", history]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True)
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def start_worker(binary: str, runs: Path, log: Path) -> subprocess.Popen[bytes]:
    """The Go worker serving both queues, its runs as JSON lines in ``runs``, its log in ``log``."""
    args = ["worker", "-redis", REDIS_URL, "-queues", QUEUES, "-fail", FAIL_TYPE, "-out", str(runs)]
    args += ["-sleep", f"{SLOW_TYPE}={SLOW_S}s"]
    with open(log, "wb") as sink:
        return subprocess.Popen([binary, *args], stdout=sink, stderr=sink)


async def prepare(db: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PM_")}
    env["PM_DATABASE_URL"] = db
    cli = Path(sys.executable).parent / "periodic-manager"
    command = [str(cli), "migrate"]
    await asyncio.to_thread(subprocess.run, command, env=env, check=True, capture_output=True)
    conn = await asyncpg.connect(db)
    try:
        await conn.executemany(
            "INSERT INTO periodic_jobs (name, spec, timezone, task_type, payload, options, enabled)"
            " VALUES ($1, '@every 1s', 'UTC', $2, $3, $4, true)",
            [(n, t, p, json.dumps(o)) for n, t, p, o, _, _ in SCHEDULES],
        )
        return str((await conn.fetchval("SHOW server_version")).split()[0])
    finally:
        await conn.close()


async def recorded(db: str) -> tuple[dict[str, str], Counter[tuple[str, str]], dict[str, Any]]:
    """Task id -> schedule name of every slot recorded ``enqueued``; every outcome counted; the
    schedules paused (name -> who, note)."""
    conn = await asyncpg.connect(db)
    try:
        rows = await conn.fetch("SELECT name, slot_at, status FROM pm_runs")
        paused = await conn.fetch(
            "SELECT name, paused_by, paused_note FROM periodic_jobs WHERE paused_at IS NOT NULL"
        )
    finally:
        await conn.close()
    sent = {
        idempotency_key(r["name"], r["slot_at"]): r["name"]
        for r in rows
        if r["status"] == "enqueued"
    }
    outcomes = Counter((r["name"], r["status"]) for r in rows)
    return sent, outcomes, {r["name"]: (r["paused_by"], r["paused_note"]) for r in paused}


async def drain(client: aioredis.Redis, sent: dict[str, str], seconds: float) -> int:
    """Wait (bounded) until no task sent is pending, active or waiting for a retry; how many are."""
    queues = {n: o.get("queue", "default") for n, _, _, o, _, _ in SCHEDULES}
    deadline = time.monotonic() + seconds
    while True:
        busy = 0
        for task_id, name in sent.items():
            state = await client.hget(f"asynq:{{{queues[name]}}}:t:{task_id}", "state")
            busy += state in (b"pending", b"active", b"retry", b"scheduled")
        if not busy or time.monotonic() > deadline:
            return busy
        await asyncio.sleep(1)


async def go_client(binary: str, client: aioredis.Redis, sent: dict[str, str]) -> dict[str, Any]:
    """asynq's own Client meets the manager's tasks: the id of a slot sent is taken (asynq
    answers ErrTaskIDConflict); a Unique task of go.unique's queue, type and payload takes the
    very lock key the target computes (``message.unique_key``) and writes for its tasks."""
    plain = next(i for i, n in sent.items() if n == "go.plain")
    args = [binary, "enqueue", "-redis", REDIS_URL]
    conflict = [
        *args,
        "-type",
        "demo:plain",
        "-payload",
        '{"n":1,"to":"a@example.com"}',
        "-id",
        plain,
    ]
    unique = [*args, "-type", "demo:unique", "-payload", '{"k":"u"}', "-queue", "mail"]
    answers = []
    for command in (conflict, [*unique, "-unique", "60s"]):
        done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True)
        answers.append(json.loads(done.stdout))
    locks = sorted(k.decode() for k in await client.keys("asynq:{mail}:unique:*"))
    holder = await client.get(locks[0]) if len(locks) == 1 else None
    return {
        "id": plain,
        "conflict": answers[0]["outcome"],
        "unique": answers[1],
        "locks": locks,
        "holder": holder.decode() if holder else None,
        "target_key": unique_key("mail", "demo:unique", b'{"k":"u"}'),
    }


async def run(seconds: float, binary: str, tmp: Path) -> dict[str, Any]:
    name = f"pm_asynqgo_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(f"{PG_DSN}/postgres")
    await admin.execute(f'CREATE DATABASE "{name}"')
    db = f"{PG_DSN}/{name}"
    client = aioredis.from_url(REDIS_URL)
    await client.flushdb()
    runs_path = tmp / "runs.jsonl"
    worker = start_worker(binary, runs_path, tmp / "worker.log")
    env = {
        "PM_DATABASE_URL": db,
        "PM_TARGET": "asynq",
        "PM_ASYNQ_REDIS_URL": REDIS_URL,
        "PM_REDIS_URL": REDIS_URL,
        "PM_STREAM_PREFIX": f"pmgo{uuid.uuid4().hex[:6]}",
        "PM_LOG_FORMAT": "text",
    }
    manager = ManagerProcess(env, tmp / "manager.log")
    out: dict[str, Any] = {"db": name}
    try:
        out["pg"] = await prepare(db)
        manager.start()
        await asyncio.sleep(seconds * 0.75)
        out["live"] = inspect(binary, REDIS_URL)
        out["live_at"] = datetime.now(UTC)
        await asyncio.sleep(seconds * 0.25)
        out["manager_exit"] = manager.stop()
        out["sent"], out["outcomes"], out["paused"] = await recorded(db)
        out["busy"] = await drain(client, out["sent"], 60)
        worker.terminate()
        out["worker_exit"] = worker.wait(30)
        out["lock_left"] = await client.exists(UNIQUE_LOCK)
        out["client"] = await go_client(binary, client, out["sent"])
        out["final"] = inspect(binary, REDIS_URL, ",".join(s[0] for s in SCHEDULES))
        out["redis"] = (await client.info("server"))["redis_version"]
        out["runs"] = [json.loads(line) for line in runs_path.read_text().splitlines()]
    finally:
        manager.stop()
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        await client.flushdb()
        await client.aclose()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    return out


def versions(binary: str, asynq_version: str) -> tuple[str, str]:
    """(Go release, asynq version) of the worker binary: a module build names asynq's version
    itself; a GOPATH build (no module data) takes the one given with --asynq-version."""
    out = subprocess.run([binary, "version"], capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    built = doc["modules"].get("github.com/hibiken/asynq", "")
    if built and asynq_version and built != asynq_version:
        sys.exit(f"--asynq-version {asynq_version}, but the binary holds asynq {built}")
    if not (built or asynq_version):
        sys.exit("--asynq-version is needed: the binary carries no module versions")
    return str(doc["go"]), built or asynq_version


def report(out: dict[str, Any], seconds: float) -> tuple[list[str], list[str]]:
    tasks = {t["id"]: t for t in out["final"]["tasks"]}
    rows, errors = check_runs(out["sent"], out["runs"], tasks)
    entry_lines, entry_errors = check_entries(
        out["live"]["entries"], out["live_at"], set(out["paused"])
    )
    errors += entry_errors + check_history(out["final"]["history"], out["sent"])
    if out["busy"]:
        errors.append(f"{out['busy']} task(s) still not final after the drain")
    errors += check_unique(out) + check_client(out["client"])
    overlap_lines, overlap_errors = check_overlap(out)
    pause_lines, pause_errors = check_pause(out)
    errors += overlap_errors + pause_errors
    if sorted(out["final"]["queues"]) != sorted(QUEUES.split(",")):
        errors.append(f"inspector: queues {out['final']['queues']}, want {QUEUES}")
    if out["final"]["entries"]:
        errors.append("inspector: scheduler entries left after the manager stopped")
    others = sorted(f"{n} {s} {c}" for (n, s), c in out["outcomes"].items() if s != "enqueued")
    head = ["schedule", "slots", "runs", "ok", "dup", "lost", "final state (asynq Inspector)"]
    table = [head, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = [
        "asynq Go check (bench/asynq_go_check.py): a `periodic-manager manager` process",
        f"(PM_TARGET=asynq) sends {len(SCHEDULES)} @every 1s schedules for {seconds:g} s; an unmodified Go",
        f"asynq.Server (examples/asynq_worker, asynq {out['asynq']}, 1 s retry delay) serves queues",
        f"{QUEUES}; {FAIL_TYPE} always fails (max_retry 2: 3 runs, then archived).",
        f"worker built with {out['go']}, asynq {out['asynq']}; Redis {out['redis']}; PostgreSQL {out['pg']};",
        f"Python {platform.python_version()}; {os.cpu_count()} CPUs, Linux {platform.release()}",
        "",
        *(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
            for r in table
        ),
        "",
        "slots: pm_runs rows `enqueued`; runs: handler calls; ok: task id = <name>:<slot UTC>, type,",
        "payload, queue, max retry as sent, retry counts 0..max_retry; dup: run more often; lost: never run",
        f"other outcomes in pm_runs: {', '.join(others) or 'none'}",
        *(
            [
                "  (go.unique failed: its slot came while the previous slot's task, holding the 30 s",
                "  lock, was still pending; asynq's client refuses such a task too)",
            ]
            if ("go.unique", "failed") in out["outcomes"]
            else []
        ),
        *overlap_lines,
        *pause_lines,
        f"go.unique lock after the drain: {'present' if out['lock_left'] else 'released'}",
        f"asynq Client (after the drain), Enqueue with TaskID of a slot sent: {out['client']['conflict']};",
        f"  with Unique(60s), go.unique's type and payload: {out['client']['unique']['outcome']}, lock"
        f" {', '.join(out['client']['locks'])}"
        f" {'= the target' if out['client']['locks'] == [out['client']['target_key']] else '!= the target'}'s key",
        "",
        f"asynq Inspector.SchedulerEntries at {out['live_at']:%H:%M:%S} UTC (the manager running):",
        *entry_lines,
        f"asynq Inspector.Queues: {', '.join(sorted(out['final']['queues']))};"
        " after the stop: SchedulerEntries "
        + f"{len(out['final']['entries'])}; ListSchedulerEnqueueEvents: "
        + ", ".join(f"{n} {len(h)}" for n, h in sorted(out["final"]["history"].items())),
        f"manager exit {out['manager_exit']}, worker exit {out['worker_exit']}",
        "",
        f"result: {'OK' if not errors else f'{len(errors)} MISMATCH(ES)'}",
        *errors[:30],
    ]
    return lines, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--out", default="")
    parser.add_argument("--append", action="store_true", help="add to --out, do not replace it")
    parser.add_argument("--asynq-version", default="", help="asynq version built in (GOPATH build)")
    args = parser.parse_args()
    binary = worker_binary()
    go, asynq_version = versions(binary, args.asynq_version)
    tmp = Path(mkdtemp(prefix="pm-asynqgo-"))
    out = asyncio.run(run(args.seconds, binary, tmp))
    out |= {"go": go, "asynq": asynq_version}
    lines, errors = report(out, args.seconds)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "a" if args.append else "w") as sink:
            sink.write(("\n" if args.append else "") + text)
    if errors:
        print(f"logs: {tmp}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
