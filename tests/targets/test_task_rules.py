"""Refused at write time: what a target refuses in a task whenever it is sent (the rule it
declares in its own module, periodic_manager/plugins/task_rules.py) is a 422 over the API naming
the field and the target, a row error for a row written with SQL (its last good version keeps
running), and a refused entry for ``import``; for the schedule's target, ``options.target`` or
the default. The three schedules of issue 36 (RQ ``task_type`` without a dot, Dramatiq queue
``q:x``, procrastinate payload ``[1, 2]``) are among them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from periodic_manager.api.app import create_app
from periodic_manager.api.state import state_of
from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import RowError
from periodic_manager.db import judge as dbjudge
from periodic_manager.db.engine import create_engine
from periodic_manager.errors import ConfigError
from periodic_manager.plugins import installed, task_rules
from periodic_manager.runtime.assemble import build_manager
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.rules import TARGET_REFUSES
from periodic_manager.settings import Settings
from periodic_manager.targets import registry
from periodic_manager.targets.memory import MemoryTarget
from tests.support import rawsql

T0 = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)
OTHERS = ("rq", "dramatiq", "procrastinate", "arq", "celery", "redis")
PG = "postgresql+asyncpg://u@h/db"  # procrastinate needs PostgreSQL (settings check the URL only)
# A task every target takes.
BASE: dict[str, Any] = {"spec": "* * * * *", "task_type": "jobs.build", "payload": None}

# (target, what the task holds, the field named, words of the reason)
REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    ("rq", {"task_type": "build"}, "task_type", "dotted path 'module.function'"),  # issue 36
    ("rq", {"task_type": "jobs."}, "task_type", "dotted path"),
    ("rq", {"task_type": ".build"}, "task_type", "dotted path"),
    ("dramatiq", {"options": {"queue": "q:x"}}, "options.queue", "not a Dramatiq queue name"),  # 36
    ("dramatiq", {"options": {"queue": "2jobs"}}, "options.queue", "not a Dramatiq queue name"),
    ("dramatiq", {"options": {"queue": "jobs.DQ"}}, "options.queue", "delay (.DQ) or dead-letter"),
    ("dramatiq", {"options": {"queue": "jobs.XQ"}}, "options.queue", "dead-letter"),
    (
        "procrastinate",
        {"payload": [1, 2]},
        "payload",
        "object of keyword arguments or null, not an array",
    ),  # 36
    ("procrastinate", {"payload": "x"}, "payload", "not a string"),
    ("procrastinate", {"payload": 3}, "payload", "not a number"),
    ("procrastinate", {"payload": False}, "payload", "not false"),
    ("procrastinate", {"task_type": "j." + "t" * 127}, "task_type", "at most 128 characters"),
    ("arq", {"payload": {"_job_id": "mine"}}, "payload", "_job_id are reserved by arq"),
    ("arq", {"payload": {"a": 1, "function": "f", "_expires": 1}}, "payload", "_expires, function"),
]
ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("rq", {"task_type": "a.b.c"}),
    ("dramatiq", {"task_type": "build", "options": {"queue": "jobs_2.x-y"}}),
    ("dramatiq", {"options": {"queue": "jobs.DQx"}}),
    ("procrastinate", {"task_type": "build", "payload": {"a": [1, 2]}}),
    ("procrastinate", {"task_type": "j." + "t" * 126, "payload": None}),
    ("arq", {"task_type": "build", "payload": {"job_id": 1, "functions": "_job_id"}}),
    ("arq", {"payload": ["_job_id", "function"]}),
    # targets with no rule of their own take what the common checks pass
    ("celery", {"task_type": "build", "payload": [1, 2], "options": {"queue": "q:x"}}),
    ("redis", {"task_type": "build", "payload": [1, 2], "options": {"queue": "q:x"}}),
    ("outbox", {"task_type": "build", "payload": {"_job_id": 1}, "options": {"queue": "q.DQ"}}),
]
ISSUE_36 = [REFUSED[0], REFUSED[3], REFUSED[7]]


def fields(target: str, task: dict[str, Any], *, route: bool = True) -> dict[str, Any]:
    """A schedule's fields: ``task`` over BASE, sent to ``target`` by options.target."""
    options = {**task.get("options", {}), **({"target": target} if route else {})}
    return {**BASE, **task, "options": options}


def deployment(default: str = "outbox") -> Settings:
    return Settings(
        database_url=PG,
        target=default,
        targets=tuple(t for t in (*OTHERS, "outbox") if t != default),
    )


def create(settings: Settings, **values: Any) -> PeriodicTaskConfig:
    return PeriodicTaskConfig.create(
        name="x", allowed_targets=settings.configured_targets(), **values
    )


# -- the rule of each target ----------------------------------------------------------------------


def test_every_target_says_which_rules_it_declares_and_where() -> None:
    declared = {name: registry.plugin(name).task_problem for name in installed.names()}
    assert {n for n, path in declared.items() if path} == {
        "arq",
        "rq",
        "dramatiq",
        "procrastinate",
        "asynq",
        "http",
    }
    for name, path in declared.items():
        rule = task_rules.rule_of(name)
        assert (rule is None) == (path is None), name
        if rule is not None:  # next to the target's own code
            assert f"{rule.__module__}:{rule.__name__}" == path
            # a module of its own, or one of its package (the http target's options.py)
            assert path in (
                f"periodic_manager.targets.{name}:task_problem",
                f"periodic_manager.targets.{name}.options:task_problem",
            )
    assert task_rules.rule_of("sqs") is None


@pytest.mark.parametrize(("target", "task", "field", "words"), REFUSED)
def test_a_task_the_schedules_target_refuses_names_the_field_and_the_target(
    target: str, task: dict[str, Any], field: str, words: str
) -> None:
    routed, default = fields(target, task), fields(target, task, route=False)
    for settings, values in ((deployment(), routed), (deployment(target), default)):
        with pytest.raises(ConfigError) as err:
            create(settings, **values)
        assert err.value.field == field and err.value.code == TARGET_REFUSES
        assert f"the {target} target refuses it: " in err.value.reason and words in err.value.reason
    # Another target takes the same task: the rule is its own target's, no one else's.
    create(deployment(), **default)
    create(deployment("redis"), **default)
    # Code that builds configs without a deployment (or with plain names) is not asked.
    PeriodicTaskConfig.create(name="x", **routed)
    PeriodicTaskConfig.create(name="x", allowed_targets=(target,), **default)


@pytest.mark.parametrize(("target", "task"), ACCEPTED)
def test_a_task_the_target_takes_is_accepted(target: str, task: dict[str, Any]) -> None:
    create(deployment(), **fields(target, task))
    create(deployment(target), **fields(target, task, route=False))


# -- the row judge: rows written with SQL ---------------------------------------------------------


def raw_row(i: int, values: dict[str, Any], sqlite: bool) -> tuple[Any, ...]:
    row = (
        i,
        True,
        f"job.{i}",
        values["spec"],
        "UTC",
        None,
        values["task_type"],
        json.dumps(values["payload"]),
        json.dumps(values["options"]),
        None,
        i,
    )
    if not sqlite:
        return row
    # SQLite's driver gives bytes, and enabled as 1 (tests/db/test_row_judge.py)
    return (i, b"1", *(v.encode() if isinstance(v, str) else v for v in row[2:10]), i)


@pytest.mark.parametrize(
    "sqlite,jsonb",
    [(False, False), (False, True), (True, False)],
    ids=["postgresql-text", "postgresql-jsonb", "sqlite"],
)
def test_a_row_the_target_refuses_is_a_row_error_on_every_path_of_the_judge(
    sqlite: bool, jsonb: bool
) -> None:
    """judge() and the provider's RowJudge say the same, also for a row whose shape (spec, zone,
    task type, options) an earlier valid row had: the payload rules are asked for it too."""
    rules = dbjudge.rules_for(sqlite, 65_536, deployment().configured_targets())
    fast = dbjudge.RowJudge(rules)
    fast.jsonb = jsonb
    good = [fields(t, task) for t, task in ACCEPTED]
    # A refused payload right after a valid row of the same shape (with a payload it takes).
    rows: list[tuple[Any, ...]] = []
    for target, task, field, _ in REFUSED:
        bad = fields(target, task)
        if field == "payload":
            rows.append(raw_row(len(rows) + 1, {**bad, "payload": {"a": 1}}, sqlite))
        rows.append(raw_row(len(rows) + 1, bad, sqlite))
    rows += [raw_row(len(rows) + 1, values, sqlite) for values in good]
    verdicts = [(dbjudge.judge(rules, r), fast(r)) for r in rows + rows]
    for a, b in verdicts:
        if isinstance(a, RowError):
            assert isinstance(b, RowError) and (a.field, a.reason, a.code) == (
                b.field,
                b.reason,
                b.code,
            )
        else:
            assert isinstance(a, PeriodicTaskConfig) and isinstance(b, PeriodicTaskConfig)
    errors = [b for _, b in verdicts[: len(rows)] if isinstance(b, RowError)]
    assert [(e.field, e.code) for e in errors] == [(f, TARGET_REFUSES) for _, _, f, _ in REFUSED]
    assert all(
        f"the {t} target refuses it" in e.reason for e, (t, *_) in zip(errors, REFUSED, strict=True)
    )


def test_a_payload_text_with_blanks_around_is_judged_by_its_value() -> None:
    """A json (not jsonb) column keeps the text as written: blanks around it change nothing."""
    rules = dbjudge.rules_for(False, 65_536, deployment().configured_targets())
    fast = dbjudge.RowJudge(rules)
    options = json.dumps({"target": "procrastinate"})
    texts = [' {"a": 1}', "\n null ", "{}", " [1, 2]", '\t"x" ', " 3", "null"]
    rows = [
        (i, True, f"j{i}", "* * * * *", "UTC", None, "t", text, options, None, i)
        for i, text in enumerate(texts, 1)
    ]
    for verdicts in ([dbjudge.judge(rules, r) for r in rows], [fast(r) for r in rows + rows]):
        kinds = [v.field if isinstance(v, RowError) else "ok" for v in verdicts]
        assert kinds[:7] == ["ok", "ok", "ok", "payload", "payload", "payload", "ok"], verdicts


def test_a_deployment_whose_targets_declare_no_rule_asks_nothing_per_row() -> None:
    assert (
        dbjudge.rules_for(
            False, 1000, Settings(target="redis", targets=("outbox", "celery")).configured_targets()
        ).task_check
        is None
    )
    assert dbjudge.rules_for(False, 1000, None).task_check is None
    assert dbjudge.rules_for(False, 1000, deployment().configured_targets()).task_check is not None


# -- the API, a manager and the import, on PostgreSQL ---------------------------------------------


@asynccontextmanager
async def running(
    url: str, settings: Settings, *, manager: bool
) -> AsyncIterator[tuple[httpx.AsyncClient, Any, MemoryTarget]]:
    """The API (with a manager in its process that sends to a memory target, or none) from T0
    on a VirtualClock."""
    clock, target = VirtualClock(T0), MemoryTarget()
    engine = create_engine(url)
    app = create_app(
        settings,
        clock=clock,
        engine=engine,
        manager_factory=(lambda eng: build_manager(settings, eng, clock=clock, target=target))
        if manager
        else None,
    )
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
                yield c, (state_of(app).manager, clock), target
    finally:
        await engine.dispose()


def on(url: str, default: str = "outbox") -> Settings:
    # One leader, no change signal: the VirtualClock jumps minutes (see test_last_good.py).
    return deployment(default).model_copy(
        update={
            "database_url": url,
            "coordination": "leader",
            "listen": False,
            "sync_interval": 30,
            "grace": 30,
            "heartbeat_interval": 5,
        }
    )


async def test_the_api_answers_422_naming_the_field_and_the_target(migrated_pg_url: str) -> None:
    async with running(migrated_pg_url, on(migrated_pg_url), manager=False) as (client, _, _):
        for i, (target, task, field, words) in enumerate(REFUSED):
            r = await client.post("/schedules", json={"name": f"bad.{i}", **fields(target, task)})
            assert r.status_code == 422, r.text
            [error] = r.json()["errors"]
            assert (error["field"], error["code"]) == (field, TARGET_REFUSES), error
            assert f"the {target} target refuses it" in error["reason"] and words in error["reason"]
        for i, (target, task) in enumerate(ACCEPTED):
            r = await client.post("/schedules", json={"name": f"good.{i}", **fields(target, task)})
            assert r.status_code == 201, r.text
        # A PATCH that would make a good schedule refused is refused; the row is unchanged.
        sid = (await client.post("/schedules", json={"name": "to.rq", **fields("rq", {})})).json()[
            "id"
        ]
        r = await client.patch(f"/schedules/{sid}", json={"task_type": "build"})
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "task_type", r.text
        r = await client.patch(
            f"/schedules/{sid}", json={"options": {"target": "dramatiq", "queue": "q:x"}}
        )
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "options.queue", r.text
        assert (await client.get(f"/schedules/{sid}")).json()["task_type"] == "jobs.build"
    # With no options.target, the default target's rules hold.
    for target, task, field, _ in ISSUE_36:
        async with running(migrated_pg_url, on(migrated_pg_url, target), manager=False) as (
            client,
            _,
            _,
        ):
            r = await client.post(
                "/schedules",
                json={"name": f"{target}.default", **fields(target, task, route=False)},
            )
            assert r.status_code == 422 and r.json()["errors"][0]["field"] == field, r.text
            assert f"the {target} target refuses it" in r.text


async def test_a_row_written_with_sql_is_a_row_error_and_its_last_good_version_runs(
    migrated_pg_url: str,
) -> None:
    url = migrated_pg_url
    async with running(url, on(url), manager=True) as (client, (manager, clock), target):
        ids = {}
        for i, (name, _, _, _) in enumerate(REFUSED):
            body = {"name": f"s.{i}", **fields(name, {})}
            ids[i] = (await client.post("/schedules", json=body)).json()["id"]
        await clock.advance_to(
            datetime(2026, 3, 1, 12, 1, 30, tzinfo=UTC),
            settle=lambda: manager.wait_settled(clock.now()),
        )
        # Every row turns into a task its target refuses (plain SQL: the API would refuse it).
        for i, (name, task, _, _) in enumerate(REFUSED):
            bad = fields(name, task)
            await rawsql.execute(
                url,
                (
                    f"UPDATE periodic_jobs SET task_type = '{bad['task_type']}', payload = '{json.dumps(bad['payload'])}',"
                    f" options = '{json.dumps(bad['options'])}' WHERE id = {ids[i]}"
                ),
            )
        born_bad = await rawsql.insert(
            url, "born.bad", task_type="'build'", options='\'{"target": "rq"}\''
        )
        await clock.advance_to(
            datetime(2026, 3, 1, 12, 3, 30, tzinfo=UTC),
            settle=lambda: manager.wait_settled(clock.now()),
        )
        for i, (name, _, field, words) in enumerate(REFUSED):
            detail = (await client.get(f"/schedules/{ids[i]}")).json()
            [error] = [e for e in detail["errors"] if e["source"] == "manager"]
            assert [e["field"] for e in detail["errors"] if e["source"] == "api"] == [field]
            assert error["field"] == field and f"the {name} target refuses it" in error["reason"], (
                error
            )
            assert words in error["reason"] and error["last_good_since"] is not None
            # the good version keeps running: 12:01, 12:02 and 12:03, as it was
            sent = [t for t, _ in target.messages if t.name == f"s.{i}"]
            assert [t.scheduled_at.minute for t in sent] == [1, 2, 3]
            assert all(t.task_type == "jobs.build" and t.payload_json == "null" for t in sent)
        errors = (await client.get(f"/schedules/{born_bad}")).json()["errors"]
        assert sorted(e["source"] for e in errors) == ["api", "manager"]  # both judge alike
        assert all(
            e["field"] == "task_type" and "the rq target refuses it" in e["reason"] for e in errors
        )
        assert manager.entry(born_bad) is None and target.slots("born.bad") == []


def test_import_refuses_an_entry_its_target_would_refuse(
    migrated_pg_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from periodic_manager.cli.main import main

    monkeypatch.setenv("PM_TARGET", "outbox")
    monkeypatch.setenv("PM_TARGETS", ",".join(OTHERS))
    path = tmp_path / "s.json"
    for target, task, field, words in ISSUE_36:
        path.write_text(
            json.dumps([{"name": "ok", **fields("rq", {})}, {"name": "n", **fields(target, task)}])
        )
        assert main(["import", str(path), "--database-url", migrated_pg_url]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert f"entry 2 ('n'): {field}: the {target} target refuses it: " in line and words in line
    path.write_text(
        json.dumps([{"name": f"g.{i}", **fields(t, task)} for i, (t, task) in enumerate(ACCEPTED)])
    )
    assert main(["import", str(path), "--database-url", migrated_pg_url]) == 0, (
        capsys.readouterr().err
    )
