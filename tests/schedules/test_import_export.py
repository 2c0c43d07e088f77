"""``periodic-manager import / export / next`` on a real database (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from periodic_manager.cli.main import main
from periodic_manager.db.engine import create_engine
from periodic_manager.db.migrate import upgrade_sync
from periodic_manager.db.models import jobs_table
from tests.support import rawsql

YAML = """\
schedules:
  - name: reports.daily
    spec: "0 6 * * *"
    timezone: Europe/Moscow
    task_type: reports.build
    payload: {format: pdf, pages: [1, 2]}
    options: {queue: reports, max_retry: 3}
    description: morning report
  - name: cleanup
    spec: "@every 90s"
    task_type: db.cleanup
    anchor: "2026-01-01T00:00:00Z"
    enabled: false
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        u = f"sqlite+aiosqlite:///{tmp_path}/pm.db"
    else:
        u = str(request.getfixturevalue("pg_url"))
    upgrade_sync(u)
    return u


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def rows(url: str) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        engine = create_engine(url)
        try:
            async with engine.connect() as conn:
                result = await conn.execute(select(jobs_table))
                return {r.name: r for r in result.all()}
        finally:
            await engine.dispose()

    return asyncio.run(read())


def test_import_dry_run_then_write_then_unchanged(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(YAML)
    code, out, _ = cli(capsys, "import", str(f), "--database-url", url, "--dry-run")
    assert code == 0
    assert out.splitlines() == [
        "+ create reports.daily",
        "+ create cleanup",
        "2 to create, 0 to update, 0 to delete, 0 unchanged",
        "dry run: nothing written",
    ]
    assert rows(url) == {}
    assert cli(capsys, "import", str(f), "--database-url", url)[0] == 0
    got = rows(url)
    assert got["reports.daily"].payload == {"format": "pdf", "pages": [1, 2]}
    assert got["reports.daily"].options == {"queue": "reports", "max_retry": 3}
    assert got["cleanup"].enabled is False and got["cleanup"].timezone == "UTC"
    stamp = got["cleanup"].updated_at
    code, out, _ = cli(capsys, "import", str(f), "--database-url", url)
    assert code == 0 and out.splitlines() == ["0 to create, 0 to update, 0 to delete, 2 unchanged"]
    assert rows(url)["cleanup"].updated_at == stamp  # unchanged rows are not touched


def test_update_and_prune(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(YAML)
    cli(capsys, "import", str(f), "--database-url", url)
    g = tmp_path / "one.json"
    g.write_text(json.dumps([{"name": "cleanup", "spec": "@every 2m", "task_type": "db.cleanup"}]))
    code, out, _ = cli(capsys, "import", str(g), "--database-url", url)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("~ update cleanup: spec '@every 90s' -> '@every 2m'; ")
    assert (
        "enabled False -> True" in lines[0]
        and "anchor '2026-01-01T00:00:00+00:00' -> None" in lines[0]
    )
    assert (
        lines[1]
        == "0 to create, 1 to update, 0 to delete, 0 unchanged, 1 not in the file kept (--prune deletes them)"
    )
    code, out, _ = cli(capsys, "import", str(g), "--database-url", url, "--prune")
    assert code == 0 and out.splitlines()[0] == "- delete reports.daily"
    assert set(rows(url)) == {"cleanup"} and rows(url)["cleanup"].spec == "@every 2m"


@pytest.mark.parametrize("fmt", ["json", "yaml", "toml"])
def test_export_round_trips(
    fmt: str, url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(YAML)
    cli(capsys, "import", str(f), "--database-url", url)
    code, out, _ = cli(capsys, "export", "--format", fmt, "--database-url", url)
    assert code == 0
    exported = tmp_path / f"out.{fmt}"
    exported.write_text(out)
    if fmt == "json":
        doc = json.loads(out)
        assert [e["name"] for e in doc] == ["cleanup", "reports.daily"]  # by name
        assert doc[0] == {
            "name": "cleanup",
            "spec": "@every 90s",
            "task_type": "db.cleanup",
            "enabled": False,
            "anchor": "2026-01-01T00:00:00+00:00",
        }
    code, out, _ = cli(capsys, "import", str(exported), "--database-url", url, "--prune")
    assert code == 0 and out.splitlines() == ["0 to create, 0 to update, 0 to delete, 2 unchanged"]


def test_toml_cannot_express_null(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "n.json"
    f.write_text(
        json.dumps([{"name": "n", "spec": "@daily", "task_type": "t", "payload": {"a": None}}])
    )
    assert cli(capsys, "import", str(f), "--database-url", url)[0] == 0
    code, out, err = cli(capsys, "export", "--format", "toml", "--database-url", url)
    assert code == 2 and out == "" and "TOML" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        (
            '[{"name": "ok", "spec": "@daily", "task_type": "t"}, {"name": "bad", "spec": "61 * * * *", "task_type": "t"}]',
            "json",
            "entry 2 ('bad'): spec:",
        ),
        (
            '[{"name": "x", "spec": "@daily", "task_type": "t", "colour": "red"}]',
            "json",
            "entry 1 ('x'): colour: unknown field",
        ),
        ('[{"name": "x", "spec": "@daily"}]', "json", "entry 1 ('x'): task_type: is required"),
        (
            '[{"name": "x", "spec": "@daily", "task_type": "t", "options": {"queu": 1}}]',
            "json",
            "options.queu: unknown option",
        ),
        (
            '[{"name": "x", "spec": "@daily", "task_type": "t", "anchor": "2026-01-01T00:00:00"}]',
            "json",
            "anchor:",
        ),
        (
            '[{"name": "x", "spec": "@daily", "task_type": "t"}, {"name": "x", "spec": "@daily", "task_type": "t"}]',
            "json",
            "entry 2 ('x'): name: appears twice",
        ),
        (
            "[[schedules]]\nname = 'x'\nspec = '@daily'\ntask_type = 't'\nenabled = 'yes'\n",
            "toml",
            "enabled: must be true or false",
        ),
        (
            json.dumps(
                [{"name": "x", "spec": "@daily", "task_type": "t", "payload": "x" * 70_000}]
            ),
            "json",
            "entry 1 ('x'): payload: 70002 bytes of JSON, more than the limit of 65536",
        ),
        (
            '[{"name": "x", "spec": "@daily", "task_type": "t", "options": {"catchup_window": 1e300}}]',
            "json",
            "entry 1 ('x'): options.catchup_window: must be a number of seconds > 0 and at most",
        ),
        (
            '[{"name": "x", "spec": "@daily", "task_type": "t", "options": {"start_at": "2026-01-01T00:00:00"}}]',
            "json",
            "entry 1 ('x'): options.start_at: must have an explicit UTC offset",
        ),
        (
            '[{"name": "x", "spec": "@daily", "task_type": "t", "options": {"start_at": "2026-01-02T00:00:00Z", "end_at": "2026-01-01T00:00:00Z"}}]',
            "json",
            "entry 1 ('x'): options.end_at: must be after options.start_at",
        ),
        (
            '[{"name": "x", "spec": "@hourly", "task_type": "t", "options": {"jitter": 3600}}]',
            "json",
            "entry 1 ('x'): options.jitter: must be less than the schedule's shortest gap",
        ),
        (
            '[{"name": "x", "spec": "@hourly", "task_type": "t", "options": {"jitter": true}}]',
            "json",
            "entry 1 ('x'): options.jitter: must be a number of seconds > 0",
        ),
        (
            '[{"name": "x", "spec": "@hourly", "task_type": "t", "options": {"max_runs": true}}]',
            "json",
            "entry 1 ('x'): options.max_runs: must be an integer from 1 to 1000000000",
        ),
        (
            '[{"name": "x", "spec": "@hourly", "task_type": "t", "options": {"max_runs": 0}}]',
            "json",
            "entry 1 ('x'): options.max_runs: must be an integer from 1 to 1000000000",
        ),
        (
            '[{"name": "x", "spec": "@hourly", "task_type": "t", "options": {"misfire": "every"}}]',
            "json",
            "entry 1 ('x'): options.misfire: must be one of skip, fire_once, all",
        ),
        ("{", "json", "not valid JSON"),
        ("- [unclosed", "yaml", "not valid YAML"),
        ('{"name": "x"}', "json", "expected a list of schedules"),
    ],
)
def test_a_bad_file_is_one_line_exit_2_and_nothing_written(
    content: str,
    suffix: str,
    message: str,
    url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    f = tmp_path / f"bad.{suffix}"
    f.write_text(content)
    code, out, err = cli(capsys, "import", str(f), "--database-url", url)
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert line.startswith(f"periodic-manager: error: {f}: ") and message in line, line
    assert rows(url) == {}


@pytest.mark.parametrize(
    "options",
    [
        {"start_at": "2030-01-01T00:00:00+01:00", "end_at": "2030-02-01T00:00:00Z"},
        {"misfire": "all", "catchup_window": 7200},
    ],
)
def test_import_keeps_bounds_and_misfire_all_as_written(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], options: dict[str, Any]
) -> None:
    f = tmp_path / "s.json"
    f.write_text(
        json.dumps([{"name": "x", "spec": "@daily", "task_type": "t", "options": options}])
    )
    code, _, err = cli(capsys, "import", str(f), "--database-url", url)
    assert code == 0, err
    assert rows(url)["x"].options == options


def test_next_within_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(
        capsys,
        "next",
        "0 6 * * *",
        "-n",
        "5",
        "--start-at",
        "2030-01-01T06:00:00Z",
        "--end-at",
        "2030-01-03T06:00:00Z",
    )
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == [
        "2030-01-01T06:00:00Z",
        "2030-01-02T06:00:00Z",
    ]


def test_next_without_excluded_dates(capsys: pytest.CaptureFixture[str]) -> None:
    # 2030-12-25 and 26 are Bavarian holidays; 2030-12-27 is listed; 09:00 Berlin is 08:00Z.
    code, out, err = cli(
        capsys,
        "next",
        "0 9 * * *",
        "--tz",
        "Europe/Berlin",
        "-n",
        "3",
        "--start-at",
        "2030-12-24T00:00:00Z",
        "--exclude-holidays",
        "DE-BY",
        "--exclude-dates",
        "2030-12-27,2031-01-01",
    )
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()] == [
        "2030-12-24T08:00:00Z",
        "2030-12-28T08:00:00Z",
        "2030-12-29T08:00:00Z",
    ]
    code, out, err = cli(capsys, "next", "@daily", "--exclude-holidays", "DE-QQ")
    [line] = err.strip().splitlines()
    assert (
        code == 2
        and out == ""
        and line.startswith(
            "periodic-manager: error: --exclude-holidays: holidays.subdiv: 'QQ' is not a subdivision of DE"
        )
    ), err
    code, _, err = cli(capsys, "next", "@daily", "--exclude-dates", "2030-02-30")
    assert code == 2 and "--exclude-dates: dates[0]: must be a valid date" in err, err


def test_next_stops_after_max_runs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "next", "0 6 * * *", "-n", "5", "--max-runs", "2")
    assert code == 0 and len(out.splitlines()) == 2
    code, _, err = cli(capsys, "next", "0 6 * * *", "--max-runs", "0")
    assert code == 2 and "--max-runs: must be an integer from 1 to 1000000000" in err


def test_unknown_extension_needs_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "s.txt"
    f.write_text("[]")
    code, _, err = cli(capsys, "import", str(f), "--database-url", f"sqlite:///{tmp_path}/x.db")
    assert code == 2 and "--format" in err


def test_next_prints_utc_and_local(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "next", "0 6 * * *", "--tz", "Europe/Moscow", "-n", "5")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 5
    for line in lines:
        utc, local, abbr = line.split()
        assert utc.endswith("T03:00:00Z") and local.endswith("T06:00:00+03:00") and abbr == "MSK"
    code, out, _ = cli(capsys, "next", "@every 90s", "-n", "1", "--describe")
    assert code == 0 and out.splitlines()[0] == "# Every 90 seconds" and len(out.splitlines()) == 2


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["61 * * * *"], "spec: "),
        (["@daily", "--tz", "Mars/Olympus"], "--tz: "),
        (["@daily", "-n", "0"], "-n: "),
        (["@every 1m", "--anchor", "yesterday"], "--anchor: "),
        (["@daily", "--start-at", "2026-01-01T00:00:00"], "--start-at: "),
        (["@daily", "--end-at", "9999-12-31T23:00:00-05:00"], "--end-at: "),
        (
            ["@daily", "--start-at", "2030-01-02T00:00Z", "--end-at", "2030-01-01T00:00Z"],
            "--end-at: ",
        ),
    ],
)
def test_next_rejects_bad_input_in_one_line(
    args: list[str], names: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "next", *args)
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert line.startswith("periodic-manager: error: " + names), line


# --- rows written with SQL that no manager can use ---------------------------------------------


def test_export_writes_rows_with_errors_as_stored_marked_invalid(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    good = {"name": "good", "spec": "@daily", "task_type": "t"}
    asyncio.run(rawsql.insert(url, "good", spec="'@daily'"))
    asyncio.run(rawsql.insert(url, "deep", payload=f"'{rawsql.DEEP}'"))
    # A row the manager rejects for its content, but whose columns all read: its values as stored.
    asyncio.run(rawsql.insert(url, "badspec", spec="'61 * * * *'"))
    if url.startswith("sqlite"):
        asyncio.run(rawsql.insert(url, "notjson", payload="'{oops'"))
        asyncio.run(rawsql.insert(url, "X", name="X'FF'"))
    code, out, err = cli(capsys, "export", "--database-url", url)
    assert code == 0, err
    doc = json.loads(out)
    by_name = {e.get("name"): e for e in doc}
    assert by_name["good"] == good  # no marker: a schedule like any other
    assert by_name["badspec"]["spec"] == "61 * * * *"
    assert by_name["badspec"]["invalid"].startswith("spec: ")
    # A column that cannot be read is given as the stored text.
    assert by_name["deep"]["raw"] == {"payload": rawsql.DEEP}
    assert by_name["deep"]["invalid"] == "payload: nested deeper than 100 levels"
    assert "payload" not in by_name["deep"]
    notes = err.strip().splitlines()
    assert all(
        n.startswith("periodic-manager: note: exported as stored (invalid): ") for n in notes
    )
    assert any("schedule #2 ('deep'): payload: nested deeper than 100 levels" in n for n in notes)
    if url.startswith("sqlite"):
        assert by_name["notjson"]["raw"] == {"payload": "{oops"}
        # Bytes that are not text: in hex, and the entry has no name but the stored one.
        assert by_name[None] == {
            "spec": "* * * * *",
            "task_type": "t",
            "invalid": "name: not valid UTF-8 text",
            "raw": {"name": {"hex": "ff"}},
        }
        assert len(notes) == 4 and doc[0] == by_name[None]  # an unreadable name sorts first
    else:
        assert len(notes) == 2


def test_import_rewrites_unreadable_columns_and_prune_deletes_unreadable_names(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(rawsql.insert(url, "cleanup", payload=f"'{rawsql.DIGITS}'"))
    if url.startswith("sqlite"):
        asyncio.run(rawsql.insert(url, "nameless", name="X'FF'"))
    f = tmp_path / "s.yaml"
    f.write_text(YAML)
    code, out, err = cli(capsys, "import", str(f), "--database-url", url, "--prune")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].startswith("~ update cleanup: spec '* * * * *' -> '@every 90s';")
    # (PostgreSQL keeps the 5000 digits; SQLite's numeric affinity stores them as infinity)
    assert "payload <unreadable: not valid JSON: " in lines[1]
    stored = rows(url)
    assert sorted(stored) == ["cleanup", "reports.daily"]
    assert stored["cleanup"].payload is None
    if url.startswith("sqlite"):
        assert lines[2].startswith("- delete #2 (name: not valid UTF-8 text)")
    code, out, _ = cli(capsys, "import", str(f), "--database-url", url)
    assert code == 0 and out.splitlines() == ["0 to create, 0 to update, 0 to delete, 2 unchanged"]


CALENDARS_YAML = """\
calendars:
  closed: {dates: ["2030-12-24", "2030-12-31"]}
  de-by: {holidays: {country: DE, subdiv: BY}}
schedules:
  - name: office
    spec: "0 9 * * *"
    timezone: Europe/Berlin
    task_type: t
    options: {exclude: [closed, de-by]}
"""


def calendars(url: str) -> dict[str, str]:
    return {
        n: s for n, s in asyncio.run(rawsql.execute(url, "SELECT name, spec FROM pm_calendars"))
    }


@pytest.mark.parametrize("fmt", ["json", "yaml", "toml"])
def test_calendars_are_imported_and_exported_with_the_schedules(
    fmt: str, url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(CALENDARS_YAML)
    code, out, err = cli(capsys, "import", str(f), "--database-url", url)
    assert code == 0, err
    assert out.splitlines()[:2] == [
        '+ create calendar closed: {"dates":["2030-12-24","2030-12-31"]}',
        '+ create calendar de-by: {"holidays":{"country":"DE","subdiv":"BY"}}',
    ]
    assert calendars(url) == {
        "closed": '{"dates":["2030-12-24","2030-12-31"]}',
        "de-by": '{"holidays":{"country":"DE","subdiv":"BY"}}',
    }
    code, out, err = cli(capsys, "export", "--format", fmt, "--database-url", url)
    assert code == 0 and err == "", err  # the row is valid: its calendars exist
    if fmt == "json":
        assert json.loads(out)["calendars"] == {
            "closed": {"dates": ["2030-12-24", "2030-12-31"]},
            "de-by": {"holidays": {"country": "DE", "subdiv": "BY"}},
        }
    exported = tmp_path / f"out.{fmt}"
    exported.write_text(out)
    code, out, _ = cli(capsys, "import", str(exported), "--database-url", url, "--prune")
    assert code == 0 and out.splitlines() == ["0 to create, 0 to update, 0 to delete, 1 unchanged"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '[{"name": "x", "spec": "@daily", "task_type": "t", "options": {"exclude": ["gone"]}}]',
            "entry 1 ('x'): options.exclude: no calendar named 'gone'",
        ),
        (
            '{"calendars": {"c": {"dates": ["2030-02-30"]}}, "schedules": []}',
            "calendar 'c': dates[0]: must be a valid date",
        ),
        (
            '{"calendars": {"c": {"holidays": {"country": "DE", "subdiv": "XX"}}}}',
            "calendar 'c': holidays.subdiv: 'XX' is not a subdivision of DE",
        ),
        ('{"calendars": {"bad name": {"dates": []}}}', "calendar 'bad name': calendars: must be"),
    ],
)
def test_a_bad_calendar_or_a_missing_one_is_one_line_exit_2(
    content: str, message: str, url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "bad.json"
    f.write_text(content)
    code, out, err = cli(capsys, "import", str(f), "--database-url", url)
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert line.startswith(f"periodic-manager: error: {f}: ") and message in line, line
    assert rows(url) == {} and calendars(url) == {}
