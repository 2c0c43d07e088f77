"""What bench/asynq_go_check.py expects of a real asynq server, and its verdicts.

The schedules the check inserts, with what asynq should hand the handler and leave behind; and
the checks of what was recorded (pm_runs), run (the Go worker's JSON lines) and read back through
asynq's Inspector and Client. Pure functions of those records: no process, no I/O.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from typing import Any

FAIL_TYPE = "demo:fail"
SLOW_TYPE, SLOW_S = "demo:slow", 2.5
# name, task type, payload (JSON text in the row), options, the payload bytes asynq should hand
# the handler (a JSON payload as the manager canonicalizes it: sorted keys, no blanks; a JSON
# string: its own text; null: none), the final state asynq should leave the task in ("gone":
# deleted on success).
SCHEDULES: list[tuple[str, str, str, dict[str, Any], str, str]] = [
    (
        "go.plain",
        "demo:plain",
        '{"to": "a@example.com", "n": 1}',
        {"extra": {"retention": 600}},
        '{"n":1,"to":"a@example.com"}',
        "completed",
    ),
    (
        "go.mail",
        "demo:mail",
        '"hello, asynq"',
        {
            "queue": "mail",
            "max_retry": 3,
            "timeout": 20,
            "extra": {"deadline": 60, "retention": 300},
        },
        "hello, asynq",
        "completed",
    ),
    (
        "go.unique",
        "demo:unique",
        '{"k": "u"}',
        {"queue": "mail", "unique_ttl": 30},
        '{"k":"u"}',
        "gone",
    ),
    ("go.fail", FAIL_TYPE, "null", {"max_retry": 2}, "", "archived"),
    # 2.5 s of work every 1 s: overlap=skip reads the Go server's task states (pending, active,
    # then gone: no retention) and skips the slots that come while the last task is not done.
    ("go.slow", SLOW_TYPE, "7", {"overlap": "skip"}, "7", "gone"),
    # Fails at once (no retry: archived): pause_after_failures reads the server's "archived".
    (
        "go.pause",
        FAIL_TYPE,
        '"p"',
        {"max_retry": 0, "pause_after_failures": 2, "extra": {"retention": 600}},
        "p",
        "archived",
    ),
]
QUEUES = "default,mail"
# asynq's uniqueness lock of go.unique (asynq:{<queue>}:unique:<type>:<md5 of the payload>),
# written out here rather than taken from the target, so that the check does not trust it.
UNIQUE_LOCK = "asynq:{mail}:unique:demo:unique:" + hashlib.md5(b'{"k":"u"}').hexdigest()


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def check_runs(
    sent: dict[str, str], runs: list[dict[str, Any]], tasks: dict[str, dict[str, Any]]
) -> tuple[list[list[str]], list[str]]:
    """Per schedule: slots, runs, ran as expected, duplicates, lost, final states; the mismatches."""
    spec = {n: (t, p, o, want, final) for n, t, p, o, want, final in SCHEDULES}
    by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        by_id[r["id"]].append(r)
    errors = [f"run of a task not recorded enqueued: {i}" for i in by_id if i not in sent]
    rows = []
    for name, (ttype, _, options, want, final) in spec.items():
        ids = [i for i, n in sent.items() if n == name]
        max_retry = options.get("max_retry", 25)
        expect_runs = max_retry + 1 if ttype == FAIL_TYPE else 1
        dup = lost = ok = 0
        states: Counter[str] = Counter()
        for task_id in ids:
            got = by_id.get(task_id, [])
            lost += not got
            dup += len(got) > expect_runs
            wire = {(r["type"], r["payload"], r["queue"], r["max_retry"]) for r in got}
            retries = sorted(r["retry"] for r in got)
            if wire != {(ttype, want, options.get("queue", "default"), max_retry)}:
                errors.append(f"{task_id}: ran as {sorted(wire)}")
            elif retries != list(range(expect_runs)):
                errors.append(f"{task_id}: retry counts {retries}, want 0..{expect_runs - 1}")
            else:
                ok += 1
            info = tasks.get(task_id)
            states[info["state"] if info else "gone"] += 1
            errors.extend(check_final(task_id, info, options, final))
        total = sum(len(by_id.get(i, [])) for i in ids)
        shown = ", ".join(f"{s} {c}" for s, c in sorted(states.items()))
        rows.append([name, str(len(ids)), str(total), str(ok), str(dup), str(lost), shown])
        if not ids:
            errors.append(f"{name}: no slot recorded enqueued")
    return rows, errors


def check_final(
    task_id: str, info: dict[str, Any] | None, options: dict[str, Any], final: str
) -> list[str]:
    """The state asynq left the task in, as its Inspector reads it."""
    state = info["state"] if info else "gone"
    if state != final:
        return [f"{task_id}: final state {state}, want {final}"]
    if info is None:
        return []
    errors = []
    extra = options.get("extra", {})
    if final == "completed" and info["retention_s"] != extra.get("retention"):
        errors.append(f"{task_id}: retention {info['retention_s']}")
    if final == "archived" and (
        info["retried"] != options["max_retry"] or "failing on purpose" not in info["last_err"]
    ):
        errors.append(f"{task_id}: archived with retried {info['retried']}, {info['last_err']!r}")
    if "timeout" in options and info["timeout_s"] != options["timeout"]:
        errors.append(f"{task_id}: timeout {info['timeout_s']}")
    if "deadline" in extra:
        slot = parse_iso(task_id.split(":", 1)[1])
        if parse_iso(info["deadline"]) != slot + timedelta(seconds=extra["deadline"]):
            errors.append(f"{task_id}: deadline {info['deadline']}")
    return errors


def check_entries(
    entries: list[dict[str, Any]], taken: datetime, paused: set[str]
) -> tuple[list[str], list[str]]:
    """asynq's SchedulerEntries, read while the manager ran: one per schedule, as published (a
    schedule the manager paused by then may be gone from them)."""
    by_id = {e["id"]: e for e in entries}
    lines, errors = [], []
    for name, ttype, _, _, want, _ in SCHEDULES:
        e = by_id.get(name)
        if e is None and name in paused:
            lines.append(f"  {name:<10} not listed (paused by then)")
            continue
        if e is None:
            errors.append(f"inspector: no scheduler entry {name}")
            continue
        nxt, prev = parse_iso(e["next"]), parse_iso(e["prev"]) if e["prev"] else None
        if e["spec"] != "@every 1s" or e["type"] != ttype or e["payload"] != want:
            errors.append(f"inspector: entry {name} reads {e['spec']!r} {e['type']!r}")
        if prev is None or not prev < nxt or abs((nxt - taken).total_seconds()) > 10:
            errors.append(f"inspector: entry {name} next {e['next']} prev {e['prev']}")
        lines.append(
            f"  {name:<10} spec {e['spec']!r}, type {e['type']}, opts [{', '.join(e['opts'])}],"
            f" prev {e['prev']}, next {e['next']}, {len(e['history'])} events so far"
        )
    return lines, errors


def check_unique(out: dict[str, Any]) -> list[str]:
    """go.unique: 30 s lock, 1 s slots. Each slot after the first is only sent if the Go server
    released the lock the previous task held (asynq deletes it when the task is done): so more
    than one slot sent within 30 s; a slot whose predecessor was still pending is refused, as
    asynq's client refuses it (``failed``). No other outcome than ``enqueued`` elsewhere."""
    errors = []
    sent = sum(1 for n in out["sent"].values() if n == "go.unique")
    if sent < 2:
        errors.append(f"go.unique: {sent} slot(s) sent: the lock was not released by the server")
    if out["lock_left"]:
        errors.append(f"{UNIQUE_LOCK} left after every task ran")
    for (name, status), count in out["outcomes"].items():
        if status != "enqueued" and (name, status) not in {
            ("go.unique", "failed"),
            ("go.slow", "skipped"),
            ("go.pause", "skipped"),
        }:
            errors.append(f"pm_runs: {name} {status} {count}")
    return errors


def check_overlap(out: dict[str, Any]) -> tuple[list[str], list[str]]:
    """go.slow (overlap=skip): its runs never overlap (each starts at least the work's length
    after the one before), and slots were skipped meanwhile."""
    starts = sorted(parse_iso(r["at"]) for r in out["runs"] if r["type"] == SLOW_TYPE)
    gaps = [(b - a).total_seconds() for a, b in zip(starts, starts[1:], strict=False)]
    skipped = out["outcomes"].get(("go.slow", "skipped"), 0)
    errors = []
    if len(starts) < 2 or not skipped:
        errors.append(f"go.slow: {len(starts)} run(s), {skipped} slot(s) skipped")
    if gaps and min(gaps) < SLOW_S - 0.05:
        errors.append(f"go.slow: two runs {min(gaps):.2f} s apart, while {SLOW_S} s of work")
    line = (
        f"go.slow (overlap=skip, {SLOW_S} s of work every 1 s): {len(starts)} runs, {skipped} slots"
        f" skipped, runs {min(gaps, default=0):.2f} s apart at least"
    )
    return [line], errors


def check_client(got: dict[str, Any]) -> list[str]:
    errors = []
    if got["conflict"] != "task_id_conflict":
        errors.append(f"asynq Client, TaskID({got['id']}): {got['conflict']}, want a conflict")
    if got["unique"]["outcome"] != "ok" or got["holder"] != got["unique"]["id"]:
        errors.append(f"asynq Client, Unique: {got['unique']}, lock held by {got['holder']}")
    if got["locks"] != [got["target_key"]]:
        errors.append(f"asynq Client's lock keys {got['locks']}, the target's {got['target_key']}")
    return errors


def check_history(history: dict[str, list[dict[str, Any]]], sent: dict[str, str]) -> list[str]:
    """asynq's ListSchedulerEnqueueEvents after the stop: one event per task sent, none else."""
    errors = []
    for name, *_ in SCHEDULES:
        got = Counter(ev["task_id"] for ev in history.get(name, []))
        want = {i for i, n in sent.items() if n == name}
        if set(got) != want or any(c > 1 for c in got.values()):
            errors.append(f"history of {name}: {len(got)} task ids, want the {len(want)} sent")
    return errors


def check_pause(out: dict[str, Any]) -> tuple[list[str], list[str]]:
    """go.pause (pause_after_failures 2, each task archived by the server at once): the manager
    paused it (paused_by ``manager``) and sent no slot past a few after the second failure."""
    sent = sum(1 for n in out["sent"].values() if n == "go.pause")
    who, note = out["paused"].get("go.pause", (None, None))
    errors = []
    if who != "manager" or sent < 2:
        errors.append(f"go.pause: {sent} slots sent, paused by {who!r}: {note!r}")
    others = sorted(n for n in out["paused"] if n != "go.pause")
    if others:
        errors.append(f"paused, while they should not be: {others}")
    line = f"go.pause (pause_after_failures 2, max_retry 0): {sent} slots sent, paused by {who}: {note}"
    return [line], errors
