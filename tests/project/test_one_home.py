"""Small helpers of the database layer have one home each: a second copy drifts from the first
(two "unreadable" sentinels, two comparisons of a stored value, dialect checks spelled out)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for d in ("periodic_manager", "api") for p in sorted((ROOT / d).rglob("*.py"))]


def _definitions(names: set[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {n: [] for n in names}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = node.name.lstrip("_")
                if name in names:
                    found[name].append(str(path.relative_to(ROOT)))
    return found


def test_each_helper_is_defined_once() -> None:
    found = _definitions({"Unreadable", "same_value", "stored_value", "chunks", "on_sqlite"})
    assert {n: len(paths) for n, paths in found.items()} == dict.fromkeys(found, 1), found


def test_whether_a_bind_is_sqlite_is_asked_in_one_place() -> None:
    """Whether a bind talks to SQLite is :func:`periodic_manager.db.engine.on_sqlite`."""
    check = re.compile(r"\.dialect\.name == .sqlite.")
    spelled = [
        str(p.relative_to(ROOT))
        for p in SOURCES
        if check.search(p.read_text()) and p != ROOT / "periodic_manager/db/engine.py"
    ]
    assert spelled == []
