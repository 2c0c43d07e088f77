"""The documentation is executable and cannot drift from the code.

* docs/cron.md: every example table is checked against the cron engine.
* Every page (the README and docs/*.md): relative links and their #anchors resolve; the README
  links every page and every page links back; nothing points outside the repository.
* docs/settings.md: every ``PM_*`` setting is documented, every documented one exists, with the
  code's default and flag; every ``PM_*`` name on any page is a setting (or one the tests read).
* docs/schedules.md: the row's fields are the API's, every option and ``options.extra`` key is
  documented with an example the validator accepts, and every documented one exists.
* docs/api.md and docs/dashboard.md: the endpoint tables are the app's OpenAPI paths, both ways.
* docs/operations.md: the commands are the CLI's, the metrics are what ``/metrics`` serves.
* The README: at most 200 lines, its two commands verbatim (``.ci/run`` runs the second one),
  a documentation table that lists every page.
* Code blocks, page by page, in order, against ``periodic-manager run`` started as the README
  starts it (embedded defaults: a fresh SQLite file, the outbox), in a directory of its own:
  ``curl`` commands are sent to it (they must succeed, with the status a ``# -> 201`` line after
  one documents), ``sql`` runs on its database, ``json`` schedule bodies are created through it,
  ``periodic-manager next``/``import``/``export`` run, other ``periodic-manager`` commands (they
  need services) are parsed by the CLI's own parser, the example workers parse their flags (the
  outbox worker on SQLite runs for real and must print a task), ``pip`` extras exist, ``PM_*``
  names are settings; ``yaml``/``toml`` schedule files import, Kubernetes manifests name real
  commands and settings; ``python`` blocks compile, their imports resolve, and self-contained
  ones run. A shell command the test does not know fails it.
No service is needed: everything runs on SQLite.

docs/architecture.md is checked like every page: a module moved without it fails here.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import builtins
import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import shlex
import sqlite3
import subprocess
import symtable
import sys
import tomllib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
import yaml

from periodic_manager.api import create_app
from periodic_manager.cron import CronError, next_fires, validate
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.rules import EXTRA_CHECKS, OPTION_CHECKS
from periodic_manager.settings import Settings
from tests.support import ROOT
from tests.support.servers import free_port

DOCS = ROOT / "docs"
README = ROOT / "README.md"
CRON_DOC = DOCS / "cron.md"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
CHECKED_PAGES = PAGES  # every page, the architecture included
README_MAX_LINES = 200
RUN_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -q . && .venv/bin/periodic-manager run"
)
TEST_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/ruff check . "
    "&& .venv/bin/ruff format --check . && .venv/bin/mypy && .venv/bin/python -m pytest"
)


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


# -- reading markdown ----------------------------------------------------------------------------


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence
    lang: str
    code: str

    @property
    def where(self) -> str:
        return f"{page_id(self.page)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced code block of a page, in order."""
    found, lines = [], page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(```+)\s*(\S*)\s*$", lines[i])
        if fence:
            start, body = i, []
            i += 1
            while i < len(lines) and not lines[i].startswith(fence.group(1)):
                body.append(lines[i])
                i += 1
            found.append(Block(page, start + 1, fence.group(2), "\n".join(body) + "\n"))
        i += 1
    return found


def prose(page: Path) -> str:
    """The page without its fenced code blocks (blank lines in their place, so lines count)."""
    out, inside = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inside = not inside
            out.append("")
            continue
        out.append("" if inside else line)
    return "\n".join(out)


def cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def md_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table: (header cells, rows of cells)."""
    found, lines = [], text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if not line.startswith("|") or not re.match(r"^\|\s*:?-{3,}", lines[i + 1]):
            continue
        if i > 0 and lines[i - 1].startswith("|"):
            continue
        rows = []
        for row in lines[i + 2 :]:
            if not row.startswith("|"):
                break
            rows.append(cells(row))
        found.append((cells(line), rows))
    return found


def tables_of(page: Path, first: str) -> list[list[str]]:
    """Rows of every table of ``page`` whose first header cell is ``first``."""
    return [row for header, rows in md_tables(prose(page)) if header[0] == first for row in rows]


def spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "").replace("**", "")
    kept = "".join(ch for ch in title.strip().lower() if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    for line in prose(page).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
    return {base if i == 0 else f"{base}-{i}" for base, n in seen.items() for i in range(n)}


def links(page: Path) -> list[str]:
    text = re.sub(r"`[^`]*`", "", prose(page))
    return re.findall(r"\]\(([^)\s]*)\)", text)


# -- docs/cron.md: the example tables --------------------------------------------------------------


def cron_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table whose first column is ``expression``: (header, rows)."""
    return [(h, rows) for h, rows in md_tables(text) if h[0] == "expression"]


def expression(cell: str) -> str:
    match = re.fullmatch(r"`([^`]*)`", cell)
    assert match, f"an expression cell must be one code span: {cell!r}"
    return match.group(1)


def wall(instant: datetime) -> tuple[datetime, object]:
    """What the page shows for an instant: its wall-clock time and offset."""
    return instant.replace(tzinfo=None), instant.utcoffset()


def fire_cases() -> list[tuple[str, str, str | None, str, list[str]]]:
    cases = []
    for header, rows in cron_tables(CRON_DOC.read_text(encoding="utf-8")):
        if "next fires" not in header:
            continue
        col = {name: i for i, name in enumerate(header)}
        for row in rows:
            anchor = row[col["anchor"]] if "anchor" in col and row[col["anchor"]] else None
            fires = [f.strip() for f in row[col["next fires"]].split(",")]
            cases.append((expression(row[0]), row[col["zone"]], anchor, row[col["after"]], fires))
    return cases


FIRES = fire_cases()
RULINGS = [
    (expression(row[0]), row[1])
    for header, rows in cron_tables(CRON_DOC.read_text(encoding="utf-8"))
    if header[1:] in (["rejected as"], ["accepted"])
    for row in rows
]


def test_the_page_has_its_examples() -> None:
    # A reformatted table would silently drop out of the checks below: count them.
    assert len(FIRES) >= 55 and len(RULINGS) >= 50, (len(FIRES), len(RULINGS))


@pytest.mark.parametrize(
    ("expr", "zone", "anchor", "after", "fires"),
    FIRES,
    ids=[f"{c[0]} {c[1]} {c[3]}" for c in FIRES],
)
def test_worked_example_matches_the_engine(
    expr: str, zone: str, anchor: str | None, after: str, fires: list[str]
) -> None:
    expected = [datetime.fromisoformat(f) for f in fires]
    got = next_fires(
        expr,
        datetime.fromisoformat(after),
        n=len(expected),
        tz=zone,
        anchor=datetime.fromisoformat(anchor) if anchor else None,
    )
    assert got == expected  # the same instants ...
    local = [wall(t.astimezone(ZoneInfo(zone))) for t in got]
    assert local == [wall(e) for e in expected]  # ... shown as the zone's clock shows them


@pytest.mark.parametrize(("expr", "ruling"), RULINGS)
def test_validation_example_matches_the_engine(expr: str, ruling: str) -> None:
    if ruling.startswith(tuple("abcdefghijklmnopqrstuvwxyz")) and " " not in ruling:
        with pytest.raises(CronError) as info:
            validate(expr)
        assert info.value.code == ruling
    else:
        validate(expr)


# -- pages, links, paths and names -----------------------------------------------------------------


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [
        ROOT / p
        for p in out.stdout.splitlines()
        if p.endswith((".py", ".md", ".toml", ".ini", ".txt"))
    ]


def test_no_file_points_outside_the_repository() -> None:
    pattern = re.compile(
        r"/work/shared|cron-semantics\.md|the project's cron semantics|\bdesign\.md"
    )
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in tracked_text_files()
        if path.exists() and path != Path(__file__).resolve()
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


def test_relative_links_and_their_anchors_resolve() -> None:
    broken = []
    for page in PAGES:
        for target in links(page):
            if "://" in target or target.startswith("mailto:"):
                continue
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page_id(page)} -> {target}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{page_id(page)} -> {target}: no such heading")
    assert broken == []


def test_the_readme_links_every_page_and_every_page_links_back() -> None:
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(README) if "://" not in t}
    assert [page_id(p) for p in PAGES[1:] if p.resolve() not in linked] == []
    back = [
        page_id(p)
        for p in PAGES[1:]
        if README.resolve() not in {(p.parent / t.partition("#")[0]).resolve() for t in links(p)}
    ]
    assert back == []


def test_the_readmes_documentation_table_lists_every_page() -> None:
    listed = {
        (ROOT / target.partition("#")[0]).resolve()
        for row in tables_of(README, "page")
        for target in re.findall(r"\]\(([^)\s]*)\)", row[0])
    }
    assert sorted(page_id(p) for p in PAGES[1:] if p.resolve() not in listed) == []


def test_the_readme_is_a_readme() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines: move details to a page of docs/"
    )


def test_the_two_commands_are_in_the_readme_and_ci_runs_the_second() -> None:
    commands = [b.code.strip() for b in blocks(README) if b.lang == "sh"]
    assert RUN_COMMAND in commands and TEST_COMMAND in commands
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    # ... and the first one's promise, "embedded defaults", is what the settings default to:
    text = README.read_text(encoding="utf-8")
    defaults = {name: f.default for name, f in Settings.model_fields.items()}
    assert defaults["database_url"].endswith(":///./periodic_manager.db")
    assert "`./periodic_manager.db`" in text
    assert defaults["target"] == "outbox" and "outbox target" in text
    assert f"http://{defaults['host']}:{defaults['port']}" in text


REPO_PATH = re.compile(
    r"^(?:\.ci|api|bench|docs|examples|migrations|periodic_manager|tests)/[\w./-]+$"
)


def test_every_repository_path_named_in_the_docs_exists() -> None:
    missing = [
        f"{page_id(page)}: {span}"
        for page in CHECKED_PAGES
        for span in set(spans(prose(page)))
        if REPO_PATH.match(span) and not (ROOT / span).exists()
    ]
    assert missing == []


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_every_dotted_name_of_the_package_in_the_docs_resolves() -> None:
    # Prose and code alike: periodic_manager.cron.next_fires, periodic_manager.api, ...; a module
    # that moves breaks the page that names it.
    pattern = re.compile(r"(?<![\w./])periodic_manager(?:\.[A-Za-z_]\w*)+")
    names = {
        (page_id(page), name)
        for page in CHECKED_PAGES
        for name in pattern.findall(page.read_text(encoding="utf-8"))
    }
    assert names, "no dotted name found: the pattern is broken"
    assert sorted(f"{p}: {n}" for p, n in names if not resolves(n)) == []


def example_plugin_settings() -> set[str]:
    """The variables of the example target plugin (examples/target_plugin), which docs/targets.md
    walks through: settings once it is installed, and only then."""
    package = ROOT / "examples" / "target_plugin" / "pm_jsonl_target"
    field = re.compile(r"^    (\w+): .* = Field\(", re.M)
    return {f"PM_{n.upper()}" for p in package.glob("*.py") for n in field.findall(p.read_text())}


def test_every_pm_variable_named_anywhere_is_a_setting_or_read_by_the_tests() -> None:
    settings = {f"PM_{name.upper()}" for name in Settings.model_fields} | example_plugin_settings()
    sources = [*ROOT.glob("tests/**/*.py"), *ROOT.glob("bench/*.py")]
    read_there = "".join(p.read_text(encoding="utf-8") for p in sources)

    def known(name: str) -> bool:
        if name in settings:
            return True
        if name.startswith("PM_HTTP_SECRET_"):  # the http target's secrets, one per name
            return True
        return name.startswith(("PM_TEST_", "PM_BENCH_")) and f'"{name}"' in read_there

    unknown = sorted(
        f"{page_id(page)}: {name}"
        for page in PAGES
        for name in set(re.findall(r"\bPM_[A-Z0-9_]*[A-Z0-9]\b", page.read_text(encoding="utf-8")))
        if not known(name)
    )
    assert unknown == []


# -- docs/settings.md ------------------------------------------------------------------------------

SETTINGS_DOC = DOCS / "settings.md"


def documented_settings() -> dict[str, list[str]]:
    rows = tables_of(SETTINGS_DOC, "variable")
    names = [spans(row[0])[0] for row in rows]
    assert len(names) == len(set(names)), "a setting is documented twice"
    return {spans(row[0])[0]: row for row in rows}


def cli_parser() -> argparse.ArgumentParser:
    """The parser of the installed ``periodic-manager`` command."""
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "periodic-manager"]
    module = importlib.import_module(script.module)
    assert hasattr(module, "_parser"), (
        f"{script.module} has no _parser(): update tests/project/test_docs.py"
    )
    parser: argparse.ArgumentParser = module._parser()
    return parser


def subcommands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in cli_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_setting_is_documented_and_every_documented_one_exists() -> None:
    code = {f"PM_{name.upper()}" for name in Settings.model_fields}
    documented = set(documented_settings())
    assert sorted(code - documented) == [], "settings missing from docs/settings.md"
    assert sorted(documented - code) == [], "docs/settings.md documents settings that do not exist"


def test_documented_defaults_and_flags_are_the_codes() -> None:
    flags: dict[str, set[str]] = {}
    for parser in subcommands().values():
        for action in parser._actions:
            if action.dest in Settings.model_fields:
                long = {o for o in action.option_strings if o.startswith("--")}
                flags.setdefault(action.dest, set()).update(long)
    wrong = []
    for var, (_, flag_cell, default_cell, _meaning) in documented_settings().items():
        name = var[3:].lower()
        if {f for f in spans(flag_cell) if f.startswith("--")} != flags.get(name, set()):
            wrong.append(f"{var}: flag {flag_cell!r}, the CLI has {sorted(flags.get(name, set()))}")
        default = Settings.model_fields[name].default
        literal = spans(default_cell)
        if default_cell != f"`{literal[0] if literal else ''}`" or literal[0].startswith("PM_"):
            # No default ("none"), or one derived at run time (prose, or another setting's
            # name): the field has no fixed value.
            if default not in (None, ()):
                wrong.append(
                    f"{var}: documented {default_cell!r}, the code's default is {default!r}"
                )
            continue
        shown = literal[0]
        if isinstance(default, bool):
            ok = shown == str(default).lower()
        elif isinstance(default, int | float):
            ok = re.fullmatch(r"-?[\d.]+", shown) is not None and float(shown) == default
        else:
            ok = shown == str(default)
        if not ok:
            wrong.append(f"{var}: documented default {shown!r}, the code's is {default!r}")
    assert wrong == []


def test_every_command_is_documented() -> None:
    documented = {
        span for row in tables_of(DOCS / "operations.md", "command") for span in spans(row[0])
    }
    assert documented == set(subcommands())


# -- docs/schedules.md -----------------------------------------------------------------------------

SCHEDULES_DOC = DOCS / "schedules.md"


def example_options(cell: str) -> dict[str, Any]:
    (span,) = spans(cell)
    options = json.loads(span)
    assert isinstance(options, dict), cell
    return options


def test_every_option_is_documented_with_an_example_the_validator_accepts() -> None:
    rows = tables_of(SCHEDULES_DOC, "option")
    documented = [spans(row[0])[0] for row in rows]
    assert sorted(documented) == sorted(OPTION_CHECKS), "options table != OPTION_CHECKS"
    for row in rows:
        name, options = spans(row[0])[0], example_options(row[-1])
        assert name in options, f"the example of {name} does not use it: {options}"
        PeriodicTaskConfig.create(name="doc.example", spec="@daily", task_type="t", options=options)


def test_every_extra_key_targets_read_is_documented_with_a_valid_example() -> None:
    rows = tables_of(SCHEDULES_DOC, "key")
    assert sorted(spans(row[0])[0] for row in rows) == sorted(EXTRA_CHECKS)
    for row in rows:
        options = example_options(row[-1])
        assert spans(row[0])[0] in options["extra"], row
        PeriodicTaskConfig.create(name="doc.example", spec="@daily", task_type="t", options=options)


def openapi() -> dict[str, Any]:
    spec: dict[str, Any] = create_app(
        Settings(database_url="sqlite+aiosqlite:///:memory:")
    ).openapi()
    return spec


def test_the_documented_fields_of_a_schedule_are_the_apis() -> None:
    documented = [spans(row[0])[0] for row in tables_of(SCHEDULES_DOC, "field")]
    assert sorted(documented) == sorted(
        openapi()["components"]["schemas"]["ScheduleCreate"]["properties"]
    )


# -- docs/api.md, docs/dashboard.md: endpoints -----------------------------------------------------


def route(text: str) -> tuple[str, str] | None:
    match = re.fullmatch(r"(GET|POST|PUT|PATCH|DELETE) (/[^?\s]*)(\?.*)?", text)
    return (match.group(1), re.sub(r"\{[^}]*\}", "{}", match.group(2))) if match else None


def test_the_endpoint_tables_are_the_openapi_paths() -> None:
    documented = {
        r
        for page in (DOCS / "api.md", DOCS / "dashboard.md")
        for row in tables_of(page, "endpoint")
        for span in spans(row[0])
        if (r := route(span)) is not None
    }
    served = {
        (method.upper(), re.sub(r"\{[^}]*\}", "{}", path))
        for path, methods in openapi()["paths"].items()
        for method in methods
        if method != "head"
    }
    assert sorted(served - documented) == [], (
        "endpoints missing from docs/api.md or docs/dashboard.md"
    )
    assert sorted(documented - served) == [], "documented endpoints the app does not serve"


def test_every_run_status_is_documented() -> None:
    (row,) = [
        r
        for r in tables_of(DOCS / "api.md", "endpoint")
        if spans(r[0])[0].startswith("GET /schedules/{id}/runs")
    ]
    params = openapi()["paths"]["/schedules/{schedule_id}/runs"]["get"]["parameters"]
    (status,) = [p for p in params if p["name"] == "status"]
    enum = next(s["enum"] for s in status["schema"]["anyOf"] if "enum" in s)
    assert sorted(set(enum) - set(spans(row[2]))) == []


# -- code blocks -------------------------------------------------------------------------------------

KNOWN_LANGS = {"", "text", "sh", "json", "sql", "yaml", "toml", "python"}
# Tools a reader runs whose use the tests cannot check (they need the reader's machine).
EXTERNAL = {"createdb", "psql", "redis-cli", "apt-get", "cd", "git", "kubectl"}


def test_every_code_block_has_a_known_language() -> None:
    unknown = [
        f"{b.where}: {b.lang!r}"
        for p in CHECKED_PAGES
        for b in blocks(p)
        if b.lang not in KNOWN_LANGS
    ]
    assert unknown == []


def free_names(code: str) -> set[str]:
    """Names a block uses but neither defines nor imports (a fragment of a larger program)."""
    top = symtable.symtable(code, "<doc>", "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    used: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for s in table.get_symbols():
            unbound_here = s.is_global() or (table.get_type() == "class" and not s.is_local())
            if s.is_referenced() and (table is top or unbound_here):
                used.add(s.get_name())
        for child in table.get_children():
            walk(child)

    walk(top)
    return used - defined - set(dir(builtins))


PYTHON_BLOCKS = [b for p in CHECKED_PAGES for b in blocks(p) if b.lang == "python"]


def test_there_are_python_examples_that_run() -> None:
    assert sum(1 for b in PYTHON_BLOCKS if not free_names(b.code)) >= 3


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.where for b in PYTHON_BLOCKS])
def test_python_block_compiles_imports_and_runs(block: Block, tmp_path: Path) -> None:
    tree = ast.parse(block.code, block.where)
    compile(tree, block.where, "exec")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("periodic_manager"):
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                assert resolves(name), f"{block.where}: from {node.module} import {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("periodic_manager"):
                    assert resolves(alias.name), f"{block.where}: import {alias.name}"
    if free_names(block.code):
        return  # a fragment (uses names defined elsewhere): compiled and its imports checked
    script = tmp_path / "example.py"
    script.write_text(block.code, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"{block.where}:\n{proc.stderr[-3000:]}"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PM_")}
    env.update(extra)
    return env


@dataclass
class Command:
    argv: list[str]
    env: dict[str, str]
    block: Block


def logical_lines(code: str) -> Iterator[str]:
    """Shell lines, continuations joined and quotes spanning lines kept together."""
    pending = ""
    for line in code.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        yield pending
        pending = ""
    assert not pending, f"unterminated shell line: {pending!r}"


def shell_commands(block: Block) -> Iterator[Command | int]:
    """The block's commands in order; a comment ``# -> 201`` yields the status the previous
    command is documented to answer."""
    for line in logical_lines(block.code):
        expected = re.match(r"^\s*#\s*->\s*(\d{3})\b", line)
        if expected:
            yield int(expected.group(1))
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens, part = list(lexer), []
        for token in [*tokens, ";"]:
            if token in ("&&", "||", ";", "|"):
                env = {}
                while part and re.fullmatch(r"[A-Za-z_]\w*=.*", part[0]):
                    key, _, value = part.pop(0).partition("=")
                    env[key] = value
                if part or env:
                    yield Command(part, env, block)
                part = []
            else:
                part.append(token)


def without_redirects(argv: list[str]) -> list[str]:
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token in (">", ">>", "<", "2>"):
            skip = True
        else:
            out.append(token)
    return out


def program(argv: list[str]) -> str:
    return Path(argv[0]).name if argv else ""


NEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d \S+$"
)


@dataclass
class Session:
    """One page's examples, in order, against an in-process app on a fresh SQLite database."""

    directory: Path
    client: httpx.AsyncClient | None = None
    last_status: int | None = None  # of the last curl
    ran: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"sqlite+aiosqlite:///{self.directory}/periodic_manager.db"

    def fail(self, where: str, what: str) -> None:
        pytest.fail(f"{where}: {what}", pytrace=False)

    async def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "periodic_manager", *args],
            cwd=self.directory,
            env=clean_env(PM_DATABASE_URL=self.url, **env),
            capture_output=True,
            text=True,
            timeout=120,
        )

    # - blocks

    async def run(self, block: Block) -> None:
        handler = getattr(self, f"block_{block.lang}", None)
        if handler is not None:
            await handler(block)
            self.ran.append(block.where)

    async def block_sh(self, block: Block) -> None:
        for command in shell_commands(block):
            if isinstance(command, int):
                assert self.last_status == command, (
                    f"{block.where}: documented {command}, got {self.last_status}"
                )
            else:
                self.last_status = None
                await self.command(command)

    async def block_json(self, block: Block) -> None:
        try:
            doc = json.loads(block.code)
        except ValueError as exc:
            self.fail(block.where, f"not JSON: {exc}")
        assert self.client is not None
        if isinstance(doc, dict) and {"spec", "task_type"} <= set(doc):
            r = await self.client.post("/schedules", json=doc)
            if r.status_code != 201:
                self.fail(block.where, f"the API refuses this schedule: {r.status_code} {r.text}")
            await self.client.delete(f"/schedules/{r.json()['id']}")
        elif isinstance(doc, dict) and str(doc.get("type", "")).startswith(
            "urn:periodic-manager:problem:"
        ):
            # A problem shown on a page has the members and the media type of a real one.
            never = {"name": "doc.never", "spec": "0 0 31 2 *", "task_type": "t"}
            r = await self.client.post("/schedules", json=never)
            real = r.json()
            assert r.headers["content-type"] == "application/problem+json"
            assert set(doc) == set(real), block.where
            assert [doc[k] for k in ("type", "status", "title")] == [
                real[k] for k in ("type", "status", "title")
            ]
            assert [set(e) for e in doc["errors"]] == [set(e) for e in real["errors"]], block.where
            assert doc["errors"][0]["code"] == real["errors"][0]["code"], block.where

    async def block_sql(self, block: Block) -> None:
        def execute() -> None:
            with contextlib.closing(
                sqlite3.connect(self.directory / "periodic_manager.db", timeout=30)
            ) as db:
                db.executescript(block.code)
                db.commit()

        await asyncio.to_thread(execute)
        assert self.client is not None
        items = (await self.client.get("/schedules", params={"limit": 500})).json()["items"]
        bad = [(i["name"], i["errors"]) for i in items if i["errors"]]
        if bad:
            self.fail(block.where, f"rows written by this SQL have errors: {bad}")

    def file_name(self, block: Block) -> str | None:
        first = block.code.splitlines()[0] if block.code.strip() else ""
        named = re.fullmatch(r"#\s*([\w.-]+\.(?:yaml|yml|json|toml))\s*", first)
        return named.group(1) if named else None

    async def import_dry_run(self, block: Block, name: str, text: str) -> None:
        (self.directory / name).write_text(text, encoding="utf-8")
        proc = await self.cli("import", name, "--dry-run")
        if proc.returncode != 0:
            self.fail(
                block.where,
                f"periodic-manager import {name} --dry-run: {proc.returncode}\n{proc.stderr}",
            )

    async def block_yaml(self, block: Block) -> None:
        doc = yaml.safe_load(block.code)
        name = self.file_name(block)
        if isinstance(doc, list) and all(isinstance(e, dict) and "name" in e for e in doc):
            if name is not None:
                (self.directory / name).write_text(block.code, encoding="utf-8")
            await self.import_dry_run(block, name or "example.yaml", block.code)
        elif isinstance(doc, dict) and "containers" in doc:
            self.kubernetes(block, doc)
        else:
            self.fail(block.where, "a yaml block is a schedule file or a Kubernetes manifest")

    async def block_toml(self, block: Block) -> None:
        doc = tomllib.loads(block.code)
        assert isinstance(doc.get("schedules"), list), (
            f"{block.where}: a TOML schedule file has [[schedules]]"
        )
        name = self.file_name(block)
        if name is not None:
            (self.directory / name).write_text(block.code, encoding="utf-8")
        await self.import_dry_run(block, name or "example.toml", block.code)

    def kubernetes(self, block: Block, doc: dict[str, Any]) -> None:
        commands = subcommands()
        for container in doc["containers"]:
            args = container.get("args", [])
            assert args and args[0] in commands, f"{block.where}: args {args}"
            parse(cli_parser(), args, block.where)
            for env in container.get("env", []):
                check_setting_name(env["name"], block.where)
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                command = container.get(probe, {}).get("exec", {}).get("command")
                if command:
                    assert program(command) == "periodic-manager", f"{block.where}: {command}"
                    parse(cli_parser(), command[1:], block.where)

    # - commands

    async def command(self, command: Command) -> None:
        where = f"{command.block.where} `{shlex.join(command.argv)}`"
        for key in command.env:
            check_setting_name(key, where)
        argv = without_redirects(command.argv)
        name = program(argv)
        if not argv:
            return
        if name == "export":
            for assignment in argv[1:]:
                check_setting_name(assignment.partition("=")[0], where)
        elif name == "curl":
            await self.curl(argv, where)
        elif name == "periodic-manager":
            await self.periodic_manager(argv[1:], command, where)
        elif name in ("python", "python3") and argv[1:3] in (["-m", "venv"], ["-m", "pytest"]):
            pass
        elif name in ("python", "python3") and len(argv) > 1 and argv[1].startswith("examples/"):
            await self.example(argv[1:], where)
        elif name == "pip" and argv[1:2] == ["install"]:
            check_extras(argv[2:], where)
        elif name in ("ruff", "mypy"):
            check_checker(name, argv[1:], where)
        elif name == "procrastinate":
            check_procrastinate(argv[1:], where)
        elif name not in EXTERNAL:
            self.fail(where, f"no check for {name!r}: teach tests/project/test_docs.py what it is")

    async def curl(self, argv: list[str], where: str) -> None:
        method, headers, body, url = None, {}, None, None
        args = iter(argv[1:])
        for arg in args:
            if arg == "-X":
                method = next(args)
            elif arg == "-H":
                key, _, value = next(args).partition(":")
                headers[key.strip()] = value.strip()
            elif arg in ("-d", "--data"):
                body = next(args)
            elif arg.startswith("-"):
                assert arg in ("-s", "-i", "-f", "-sS"), f"{where}: unknown curl flag {arg}"
            else:
                url = arg
        assert url is not None, where
        path = re.sub(r"^(https?://)?(localhost|127\.0\.0\.1):8000", "", url)
        assert path.startswith("/"), f"{where}: not the local API: {url}"
        method = method or ("POST" if body is not None else "GET")
        assert self.client is not None
        r = await self.client.request(method, path, headers=headers, content=body)
        self.last_status = r.status_code
        if r.status_code >= 400:
            self.fail(where, f"{r.status_code} {r.text}")

    async def periodic_manager(self, args: list[str], command: Command, where: str) -> None:
        parse(cli_parser(), args, where)
        if args[0] == "next":
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                status = importlib.import_module(cli_module()).main(args)
            assert status == 0, f"{where}: exit {status}"
            lines = out.getvalue().splitlines()
            assert lines and all(NEXT_LINE.match(x) or x.startswith("# ") for x in lines), (
                f"{where}: {lines}"
            )
            shown = [x[2:] for x in command.block.code.splitlines() if re.match(r"# \d{4}-", x)]
            assert all(NEXT_LINE.match(x) for x in shown), (
                f"{where}: the sample is not what next prints: {shown}"
            )
        elif args[0] in ("import", "export") and "--database-url" not in args:
            proc = await self.cli(*args)
            if proc.returncode != 0:
                self.fail(where, f"exit {proc.returncode}\n{proc.stderr}")

    async def example(self, argv: list[str], where: str) -> None:
        script = ROOT / argv[0]
        assert script.exists(), f"{where}: no {argv[0]}"
        opts = dict(zip(argv[1:], argv[2:], strict=False))
        if script.name == "consume_outbox.py" and opts.get("--database-url", "").startswith(
            "sqlite:///./"
        ):
            await self.consume_outbox(script, argv[1:], where)
            return
        # Needs a service: the worker's own parser must accept the flags.
        spec = importlib.util.spec_from_file_location(f"doc_{script.stem}", script)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        seen: list[argparse.Namespace] = []

        async def consume(args: argparse.Namespace) -> int:
            seen.append(args)
            return 0

        module.consume = consume
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                status = await asyncio.to_thread(module.main, argv[1:])
        except SystemExit as exc:
            self.fail(
                where, f"the worker refuses its flags: {err.getvalue().strip()} (exit {exc.code})"
            )
        assert status == 0 and seen, f"{where}: exit {status}"

    async def consume_outbox(self, script: Path, args: list[str], where: str) -> None:
        """Run the outbox worker for real on this page's database: it must print a task."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            *args,
            cwd=self.directory,
            env=clean_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
        except TimeoutError:
            self.fail(where, "printed no task within 30 s")
        finally:
            await stop_process(proc)
        task = json.loads(line)
        queue = dict(zip(args, args[1:], strict=False)).get("--queue", "default")
        assert task["queue"] == queue and task["idempotency_key"].startswith(f"{task['name']}:"), (
            task
        )


def cli_module() -> str:
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "periodic-manager"]
    return script.module


def parse(parser: argparse.ArgumentParser, args: list[str], where: str) -> None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(args)
    except SystemExit as exc:
        pytest.fail(
            f"{where}: the CLI refuses {args}: {err.getvalue().strip()} (exit {exc.code})",
            pytrace=False,
        )


def check_setting_name(name: str, where: str) -> None:
    if name.startswith("PM_"):
        assert name[3:].lower() in Settings.model_fields, f"{where}: {name} is not a setting"


def check_procrastinate(args: list[str], where: str) -> None:
    """procrastinate's own parser accepts the command (the ``--app`` the docs name, which this
    checkout cannot import, stands for tests.support.procrastinate_app.app)."""
    from procrastinate import cli

    app = "--app=tests.support.procrastinate_app.app"
    args = [app if a.startswith("--app=") else a for a in args]
    try:
        parsed = cli.parse_args(args)
    except SystemExit:
        pytest.fail(f"{where}: procrastinate refuses these arguments")
    assert parsed["command"] in ("schema", "worker"), f"{where}: {parsed['command']}"


def check_extras(args: list[str], where: str) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = set(project["optional-dependencies"])
    for arg in args:
        match = re.fullmatch(r"(?:\.|periodic-manager)\[([\w,-]+)\]", arg)
        if match:
            missing = set(match.group(1).split(",")) - extras
            assert not missing, f"{where}: no extra {sorted(missing)} in pyproject.toml"


def check_checker(name: str, args: list[str], where: str) -> None:
    """``ruff check .``, ``ruff format --check .`` and ``mypy`` (its files from ``[tool.mypy]``):
    pinned in the dev extra and configured in pyproject.toml, so the command checks what the page
    says it does."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    dev = pyproject["project"]["optional-dependencies"]["dev"]
    assert any(re.fullmatch(rf"{name}==[\d.]+", req) for req in dev), (
        f"{where}: {name} not pinned in .[dev]"
    )
    if name == "ruff":
        assert args in (["check", "."], ["format", "--check", "."]), f"{where}: ruff {args}"
        assert "ruff" in pyproject["tool"], f"{where}: no [tool.ruff] in pyproject.toml"
    else:
        assert args == [], f"{where}: mypy {args} (the files are [tool.mypy] files)"
        assert pyproject["tool"]["mypy"]["files"], f"{where}: [tool.mypy] names no files"


EXAMPLE_LANGS = ("sh", "json", "sql", "yaml", "toml")
EXAMPLE_PAGES = [p for p in CHECKED_PAGES if any(b.lang in EXAMPLE_LANGS for b in blocks(p))]


@contextlib.asynccontextmanager
async def session(directory: Path) -> AsyncIterator[Session]:
    """``periodic-manager run`` as the README starts it (embedded defaults: ./periodic_manager.db,
    outbox, API and manager in one process), on a free port, in ``directory``."""
    s, port = Session(directory), free_port()
    log = directory / "run.log"
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "periodic_manager",
            "run",
            cwd=directory,
            env=clean_env(PM_PORT=str(port)),
            stdout=err,
            stderr=err,
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for _ in range(300):
                if proc.returncode is not None:
                    pytest.fail(
                        f"periodic-manager run exited {proc.returncode}:\n{log.read_text()[-3000:]}"
                    )
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
            else:
                pytest.fail(f"periodic-manager run not ready in 30 s:\n{log.read_text()[-3000:]}")
            s.client = client
            yield s
    finally:
        await stop_process(proc)


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL after 30 s: a process that does not stop fails nothing else."""
    if proc.returncode is None:
        proc.terminate()
    try:
        await asyncio.wait_for(proc.communicate(), 30)
    except TimeoutError:
        proc.kill()
        await proc.communicate()
        raise


@pytest.mark.parametrize("page", EXAMPLE_PAGES, ids=[page_id(p) for p in EXAMPLE_PAGES])
async def test_the_examples_of_a_page_run_in_order(page: Path, tmp_path: Path) -> None:
    async with session(tmp_path) as s:
        for block in blocks(page):
            await s.run(block)
    assert s.ran, f"{page_id(page)}: no example was run"


# -- docs/operations.md: metrics -----------------------------------------------------------------


async def test_the_metrics_table_is_what_metrics_serves(tmp_path: Path) -> None:
    async with session(tmp_path) as s:
        assert s.client is not None
        text = (await s.client.get("/metrics")).text
    served = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        if name.startswith("periodic_manager_"):
            served.add(
                f"{name}_total" if kind == "counter" and not name.endswith("_total") else name
            )
    documented = {spans(row[0])[0] for row in tables_of(DOCS / "operations.md", "metric")}
    assert sorted(served - documented) == [], "metrics missing from docs/operations.md"
    assert sorted(documented - served) == [], "documented metrics /metrics does not serve"
