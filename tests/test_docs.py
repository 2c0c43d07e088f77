"""The documentation is executable: every example table of docs/cron.md is checked against the
engine, links between the repository's documents resolve, and nothing points outside the
repository."""

from __future__ import annotations

import re
import subprocess
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from periodic_manager.cron import CronError, next_fires, validate

ROOT = Path(__file__).resolve().parent.parent
CRON_DOC = ROOT / "docs" / "cron.md"


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table whose first column is ``expression``: (header, rows)."""
    found = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or cells[0] != "expression":
            continue
        rows = []
        for row in lines[i + 2 :]:
            if not row.startswith("|"):
                break
            rows.append([c.strip() for c in row.strip().strip("|").split("|")])
        found.append((cells, rows))
    return found


def expression(cell: str) -> str:
    match = re.fullmatch(r"`([^`]*)`", cell)
    assert match, f"an expression cell must be one code span: {cell!r}"
    return match.group(1)


def wall(instant: datetime) -> tuple[datetime, object]:
    """What the page shows for an instant: its wall-clock time and offset."""
    return instant.replace(tzinfo=None), instant.utcoffset()


def fire_cases() -> list[tuple[str, str, str | None, str, list[str]]]:
    cases = []
    for header, rows in tables(CRON_DOC.read_text(encoding="utf-8")):
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
    for header, rows in tables(CRON_DOC.read_text(encoding="utf-8"))
    if header[1:] in (["rejected as"], ["accepted"])
    for row in rows
]


def test_the_page_has_its_examples() -> None:
    # A reformatted table would silently drop out of the checks below: count them.
    assert len(FIRES) >= 55 and len(RULINGS) >= 50, (len(FIRES), len(RULINGS))


@pytest.mark.parametrize(("expr", "zone", "anchor", "after", "fires"), FIRES, ids=[f"{c[0]} {c[1]} {c[3]}" for c in FIRES])
def test_worked_example_matches_the_engine(
    expr: str, zone: str, anchor: str | None, after: str, fires: list[str]
) -> None:
    expected = [datetime.fromisoformat(f) for f in fires]
    got = next_fires(
        expr, datetime.fromisoformat(after), n=len(expected), tz=zone,
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


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / p for p in out.stdout.splitlines() if p.endswith((".py", ".md", ".toml", ".ini", ".txt"))]


def test_no_file_points_outside_the_repository() -> None:
    pattern = re.compile(r"/work/shared|cron-semantics\.md|the project's cron semantics|\bdesign\.md")
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in tracked_text_files()
        if path.exists() and path != Path(__file__).resolve()
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


def test_relative_links_between_documents_resolve() -> None:
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert broken == []
