"""A backup restores every row: ``export`` from database A, ``import`` into an empty database B,
and B lists what A lists (``GET /schedules``, each ``GET /schedules/{id}``), errors included,
whatever SQL wrote into A (every hostile row of tests/support/rawsql.py, on each backend that can hold
it, and more). The export of B is the export of A, byte for byte, in JSON, YAML and TOML; the
same file imported again changes nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from periodic_manager.api import create_app
from periodic_manager.cli.main import main
from periodic_manager.clock import VirtualClock
from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import upgrade_sync
from periodic_manager.settings import Settings
from tests.conftest import new_mysql_database, new_pg_database
from tests.support import rawsql
from tests.support.api import T0

# Columns of rows that are no schedule, beyond tests/support/rawsql.py's (SQL literals per backend).
EXTRA = {
    "both": {
        "paused.badspec": {"spec": "'61 * * * *'", "enabled": "false"},
        "badname with blanks": {},
        "unconfigured.target": {"options": """'{"target": "celery"}'"""},
        "unknown.option": {"options": """'{"queu": "x", "extra": {"a": [1, {"b": null}]}}'"""},
        "valid.full": {
            "timezone": "'Europe/Berlin'",
            "payload": """'{"n": 1.5, "s": "\\u00e9\\t"}'""",
            "options": """'{"queue": "q", "max_retry": 3}'""",
            "description": "'a\\b'",
        },
    },
    "sqlite": {
        "description.not.utf8": {"description": "X'C3'"},
        "created.not.iso": {"created_at": "'soon'"},
        "updated.blob": {"updated_at": "X'3230323427'"},
        "enabled.two": {"enabled": "2"},
        "enabled.blob.one": {"enabled": "X'31'"},
        "anchor.blob": {"anchor": "X'323032362d30312d3031'"},
        "spec.integer": {"spec": "5"},
        "payload.nan": {"payload": "'NaN'"},
        "spec.nul": {"spec": "'a' || char(0) || 'b'"},
    },
    "mysql": {
        "created.zero": {"created_at": "'0000-00-00 00:00:00'"},
        "updated.zero.day": {"updated_at": "'2024-05-00 00:00:00'"},
        "enabled.minus": {"enabled": "-3"},
        "payload.nan": {"payload": "'NaN'"},
        "description.accents": {"description": "'caf\u00e9 cr\u00e8me'"},
    },
    "postgresql": {
        "anchor.infinity.minus": {"anchor": "'-infinity'"},
        "created.year.10000": {"created_at": "'10000-01-01 00:00:00+00'"},
    },
}


def backend_of(url: str) -> str:
    return next(b for b in rawsql.BACKENDS if url.startswith(b))


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def two(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """Two migrated databases of one backend: A (to back up) and B (empty, to restore into)."""
    if request.param == "sqlite":
        urls = (f"sqlite+aiosqlite:///{tmp_path}/a.db", f"sqlite+aiosqlite:///{tmp_path}/b.db")
    elif request.param == "mysql":
        urls = (
            str(request.getfixturevalue("mariadb_url")),
            str(request.getfixturevalue("mariadb_url_b")),
        )
    else:
        urls = (str(request.getfixturevalue("pg_url")), str(request.getfixturevalue("pg_url_b")))
    for u in urls:
        upgrade_sync(u)
    return urls


@pytest.fixture
async def pg_url_b() -> AsyncIterator[str]:
    """A second new PostgreSQL database, dropped after the test (conftest's pg_url is the first)."""
    async with new_pg_database() as url:
        yield url


@pytest.fixture
async def mariadb_url_b() -> AsyncIterator[str]:
    """A second new MariaDB/MySQL database, dropped after the test."""
    async with new_mysql_database() as url:
        yield url


def seed(url: str) -> int:
    """Good and hostile rows, written with SQL; returns how many."""
    backend = backend_of(url)
    rows: dict[str, dict[str, str]] = {"good.minute": {}, "good.daily": {"spec": "'@daily'"}}
    for i, case in enumerate(rawsql.cases(backend)):
        rows[case.columns.get("name", f"'hostile.{i}'").strip("'")] = dict(case.columns)
    rows |= EXTRA["both"] | EXTRA[backend]
    rows["valid.full"] = {
        **rows["valid.full"],
        "anchor": rawsql.instant(url, "2026-01-01 00:00:00"),
    }
    for name, columns in rows.items():
        asyncio.run(rawsql.insert(url, name, **columns))
    return len(rows)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


async def _listing(url: str) -> list[dict[str, Any]]:
    """Every schedule as the API shows it (list and detail), without what a restore renews:
    the id, the timestamps the database stamps (shown too when they cannot be read), and who
    paused it (no part of a file: a restored paused row is paused by the import)."""
    engine = create_engine(url)
    app = create_app(Settings(database_url=url), clock=VirtualClock(T0), engine=engine)
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
                page = (await c.get("/schedules", params={"limit": 500})).json()
                out = []
                for item in page["items"]:
                    detail = (await c.get(f"/schedules/{item['id']}")).json()
                    assert detail["errors"] == item["errors"]  # no manager: the API's own
                    for body in (item, detail):
                        body.pop("id")
                        body.pop("paused")
                        for stamp in ("created_at", "updated_at"):
                            if body[stamp] is not None:
                                body.pop(stamp)
                    out.append({"item": item, "detail": detail})
    finally:
        await engine.dispose()
    return sorted(out, key=lambda x: json.dumps(x, sort_keys=True))


async def _stored(url: str) -> list[tuple[Any, ...]]:
    """Every column of every row as stored (to tell that a re-import wrote nothing)."""
    if backend_of(url) == "sqlite":
        cols = [r[1] for r in await rawsql.execute(url, "PRAGMA table_info(periodic_jobs)")]
        listed = ", ".join(f"typeof({c}), quote({c})" for c in cols)
        return await rawsql.execute(url, f"SELECT {listed} FROM periodic_jobs ORDER BY id")
    if backend_of(url) == "mysql":
        return await rawsql.execute(url, "SELECT * FROM periodic_jobs ORDER BY id")
    return await rawsql.execute(url, "SELECT t::text FROM periodic_jobs t ORDER BY id")


@pytest.mark.parametrize("fmt", ["json", "yaml", "toml"])
def test_export_then_import_restores_every_row_errors_included(
    fmt: str, two: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two
    count = seed(a)
    listed_a = asyncio.run(_listing(a))
    assert len(listed_a) == count
    code, backup, err = cli(capsys, "export", "--format", fmt, "--database-url", a)
    assert code == 0, err
    # Every row with errors, and only those, is exported as stored (the good rows as schedules).
    invalid = [x for x in listed_a if x["item"]["errors"]]
    assert 10 < len(invalid) < count and err.count("exported as stored (invalid)") == len(invalid)
    f = tmp_path / f"backup.{fmt}"
    f.write_text(backup)

    code, out, err = cli(capsys, "import", str(f), "--database-url", b)
    assert code == 0, err
    assert out.splitlines()[-1] == f"{count} to create, 0 to update, 0 to delete, 0 unchanged"

    assert asyncio.run(_listing(b)) == listed_a  # every row, every error, as A shows them
    # The export of B is the export of A.
    code, again, _ = cli(capsys, "export", "--format", fmt, "--database-url", b)
    assert code == 0 and again == backup

    # Importing the same file again is a no-op: nothing planned, nothing written.
    before = asyncio.run(_stored(b))
    code, out, err = cli(capsys, "import", str(f), "--database-url", b, "--prune")
    assert code == 0, err
    assert out.splitlines() == [f"0 to create, 0 to update, 0 to delete, {count} unchanged"]
    assert asyncio.run(_stored(b)) == before


def test_a_restored_invalid_row_stays_invalid_for_the_manager(
    two: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from periodic_manager.db.provider import DatabaseProvider

    a, b = two
    seed(a)
    f = tmp_path / "backup.json"
    f.write_text(cli(capsys, "export", "--database-url", a)[1])
    assert cli(capsys, "import", str(f), "--database-url", b)[0] == 0

    async def verdicts(url: str) -> tuple[list[str], list[tuple[str | None, str, str]]]:
        engine = create_engine(url)
        try:
            snap = await DatabaseProvider(engine).get_configs()
        finally:
            await engine.dispose()
        errors = sorted((e.name, e.field, e.reason) for e in snap.errors)
        return sorted(c.name for c in snap.configs), errors

    before = asyncio.run(verdicts(a))
    assert before[0] and before[1], before  # the seed holds good rows and bad ones
    assert asyncio.run(verdicts(b)) == before


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"raw": {"spec": "x"}}, "spec: given both as a value and in raw"),
        ({"raw": {"colour": "x"}}, "raw.colour: not a column a file may give as stored"),
        ({"raw": {"payload": 5}}, 'raw.payload: must be the stored text, or {"hex"'),
        ({"raw": {"payload": {"hex": "zz"}}}, "raw.payload: hex: must be pairs of hexadecimal"),
        ({"invalid": ""}, "invalid: must be the row's error as text"),
        ({"enabled": "yes"}, "enabled: must be true or false (or given as stored in raw)"),
        ({"payload": float("nan")}, "payload: must be a JSON value"),
        ({"anchor": "tomorrow"}, "anchor: must be an ISO 8601 instant"),
        ({"colour": 1}, "colour: unknown field"),
    ],
)
def test_a_marked_entry_is_checked_for_what_its_columns_can_hold(
    entry: dict[str, Any],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/pm.db"
    upgrade_sync(url)
    base = {"name": "x", "spec": "61 * * * *", "task_type": "t", "invalid": "spec: bad"}
    f = tmp_path / "f.json"
    f.write_text(json.dumps([{**base, **entry}]))
    code, out, err = cli(capsys, "import", str(f), "--database-url", url)
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert f"entry 1 ('x'): {message}" in line, line


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"raw": {"payload": {"hex": "fffe"}}}, "raw.payload: bytes given in hex cannot be stored"),
        ({"raw": {"enabled": "yes"}}, "raw.enabled: a PostgreSQL boolean holds only true or false"),
        ({"raw": {"options": "queue=x"}}, "raw.options: not JSON"),
        ({"spec": "a\u0000b"}, "spec: PostgreSQL cannot store NUL characters"),
        ({"spec": "*" * 201}, "spec: longer than the column's 200 characters"),
    ],
)
def test_what_postgresql_cannot_hold_is_refused_before_anything_is_written(
    entry: dict[str, Any],
    message: str,
    pg_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    upgrade_sync(pg_url)
    base = {"name": "x", "spec": "61 * * * *", "task_type": "t", "invalid": "spec: bad"}
    f = tmp_path / "f.json"
    f.write_text(
        json.dumps([{"name": "ok", "spec": "@daily", "task_type": "t"}, {**base, **entry}])
    )
    code, out, err = cli(capsys, "import", str(f), "--database-url", pg_url)
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert f"entry 2 ('x'): {message}" in line, line
    assert asyncio.run(rawsql.execute(pg_url, "SELECT count(*) FROM periodic_jobs")) == [(0,)]


def test_an_unmarked_bad_entry_is_still_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/pm.db"
    upgrade_sync(url)
    f = tmp_path / "f.json"
    f.write_text(json.dumps([{"name": "x", "spec": "61 * * * *", "task_type": "t"}]))
    code, _, err = cli(capsys, "import", str(f), "--database-url", url)
    assert code == 2 and "entry 1 ('x'): spec:" in err


def test_a_marked_entry_changed_in_the_file_updates_the_row_as_stored(
    two: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = two
    asyncio.run(rawsql.insert(a, "bad", spec="'61 * * * *'"))
    [entry] = json.loads(cli(capsys, "export", "--database-url", a)[1])
    f = tmp_path / "f.json"
    f.write_text(json.dumps([{**entry, "spec": "62 * * * *", "raw": {"description": "note"}}]))
    code, out, err = cli(capsys, "import", str(f), "--database-url", a)
    assert code == 0, err
    line = out.splitlines()[0]
    assert line.startswith("~ update bad (as stored, invalid: spec: "), line
    assert line.endswith(": spec '61 * * * *' -> '62 * * * *'; description None -> <raw 'note'>")
    [(spec, description)] = asyncio.run(
        rawsql.execute(a, "SELECT spec, description FROM periodic_jobs")
    )
    assert (spec, description) == ("62 * * * *", "note")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"raw": {"payload": {"hex": "fffe"}}}, "raw.payload: bytes given in hex cannot be stored"),
        (
            {"raw": {"enabled": "yes"}},
            "raw.enabled: a MariaDB/MySQL TINYINT holds only whole numbers",
        ),
        (
            {"raw": {"enabled": "300"}},
            "raw.enabled: a MariaDB/MySQL TINYINT holds only whole numbers",
        ),
        ({"spec": "*" * 201}, "spec: longer than the column's 200 characters"),
    ],
)
def test_what_mysql_cannot_hold_is_refused_before_anything_is_written(
    entry: dict[str, Any],
    message: str,
    mariadb_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    upgrade_sync(mariadb_url)
    base = {"name": "x", "spec": "61 * * * *", "task_type": "t", "invalid": "spec: bad"}
    f = tmp_path / "f.json"
    f.write_text(
        json.dumps([{"name": "ok", "spec": "@daily", "task_type": "t"}, {**base, **entry}])
    )
    code, out, err = cli(capsys, "import", str(f), "--database-url", mariadb_url)
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert f"entry 2 ('x'): {message}" in line, line
    assert asyncio.run(rawsql.execute(mariadb_url, "SELECT count(*) FROM periodic_jobs")) == [(0,)]
