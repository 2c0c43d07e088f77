"""The wheel: everything installs under our own name, nothing under ``api`` or ``migrations``.

The repository keeps ``api/`` and ``migrations/`` as top-level folders; the wheel maps them to
``periodic_manager.api`` and ``periodic_manager.migrations`` (pyproject's package-dir). These
tests build the real wheel, look inside it, then install it apart from the repository and use
it: import the API, build the app, and migrate a fresh database with the migrations it carries.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support import ROOT

# What is not part of the sources (ignored by git, or a checkout's own state).
IGNORED = (
    ".git",
    ".venv",
    "build",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    ".ruff_cache",
    "*.db",
    "*.db-wal",
    "*.db-shm",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy of the sources: setuptools keeps an in-tree build/ whose stale files (a
    # migration renamed since) would end up in the wheel.
    src = tmp_path_factory.mktemp("src") / "periodic_manager"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*IGNORED))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("periodic_manager-*.whl")
    return built


def repo_packages() -> set[str]:
    """Every package folder of the repository, as the dotted name it must have when installed."""
    names = set()
    for init in ROOT.glob("**/__init__.py"):
        rel = init.parent.relative_to(ROOT)
        top = rel.parts[0]
        if top in ("periodic_manager",):
            names.add(".".join(rel.parts))
        elif top in ("api", "migrations"):
            names.add(".".join(("periodic_manager", *rel.parts)))
    return names


def test_the_wheel_holds_only_our_own_top_level_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"periodic_manager"}
    top_level = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    if top_level:  # setuptools writes it; it must not name api or migrations either
        text = zipfile.ZipFile(wheel).read(top_level[0]).decode()
        assert text.split() == ["periodic_manager"]


def test_every_package_and_data_file_of_the_repository_is_in_the_wheel(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in repo_packages():
        assert package.replace(".", "/") + "/__init__.py" in names, (
            f"{package} missing from the wheel"
        )
    for migration in (ROOT / "migrations" / "versions").glob("*.py"):
        assert f"periodic_manager/migrations/versions/{migration.name}" in names
    assert "periodic_manager/migrations/script.py.mako" in names
    for asset in (ROOT / "api" / "ui" / "static").iterdir():
        assert f"periodic_manager/api/ui/static/{asset.name}" in names
    assert "periodic_manager/py.typed" in names
    scripts = lua_scripts()
    # The glob finds exactly the scripts the code loads (directly or through an include): none
    # is missed, none is left behind unused.
    assert set(loaded_scripts()) == set(scripts), (loaded_scripts(), scripts)
    for package, name in scripts:
        assert f"{package.replace('.', '/')}/scripts/{name}" in names, f"{name} missing"


def loaded_scripts() -> list[tuple[str, str]]:
    """Every script the package's code loads, as (package, name): the ``lua.script(package,
    name)`` calls, and the fragments those scripts splice in with ``--#include``."""
    call = re.compile(r'lua\.script\(\s*"([\w.]+)",\s*"(\w+\.lua)"\s*\)')
    found = []
    for path in sorted((ROOT / "periodic_manager").glob("**/*.py")):
        found.extend(call.findall(path.read_text()))
    assert found, "no lua.script(...) call found: the pattern no longer matches the code"
    todo = list(found)
    while todo:  # includes may include (``<file>`` of the same folder, ``<package>:<file>``)
        package, name = todo.pop()
        script = ROOT / package.replace(".", "/") / "scripts" / name
        for line in script.read_text().splitlines():
            if line.startswith("--#include "):
                other, _, file = line.removeprefix("--#include ").strip().rpartition(":")
                todo.append((other or package, file))
                found.append(todo[-1])
    return found


def lua_scripts() -> list[tuple[str, str]]:
    """Every Lua script of the package, as (package, file name) for ``targets.redis.lua``."""
    found = []
    for path in sorted((ROOT / "periodic_manager").glob("**/scripts/*.lua")):
        package = ".".join(path.parent.parent.relative_to(ROOT).parts)
        found.append((package, path.name))
    return found


def test_the_installed_wheel_imports_serves_and_migrates_without_the_repository(
    wheel: Path, tmp_path: Path
) -> None:
    # Installed into a folder of its own; the dependencies come from this environment. The
    # process runs away from the repository, so nothing can be imported from its folders.
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    work = tmp_path / "elsewhere"
    work.mkdir()
    script = """
import hashlib, importlib.util, json, sys
import periodic_manager, periodic_manager.api, periodic_manager.migrations
# The modules that read their Lua scripts at import.
import periodic_manager.targets.arq, periodic_manager.targets.celery.writer
import periodic_manager.targets.redis.streams, periodic_manager.targets.redis.previous
from periodic_manager.targets.redis import lua
from periodic_manager.api import create_app
from periodic_manager.cli.main import main
from periodic_manager.settings import Settings
app = create_app(Settings(database_url=sys.argv[1]))
code = main(["migrate", "--database-url", sys.argv[1]])
print(json.dumps({
    "package": periodic_manager.__file__,
    "api": periodic_manager.api.__file__,
    "migrations": periodic_manager.migrations.__file__,
    "top_level_api": importlib.util.find_spec("api") is not None,
    "top_level_migrations": importlib.util.find_spec("migrations") is not None,
    "routes": sorted(app.openapi()["paths"]),
    "migrate": code,
    "lua": [hashlib.sha1(lua.script(*s).encode()).hexdigest() for s in json.loads(sys.argv[2])],
}))
"""
    url = f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"
    scripts = lua_scripts()
    done = subprocess.run(
        [sys.executable, "-c", script, url, json.dumps(scripts)],
        cwd=work,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("package", "api", "migrations"):
        assert seen[key].startswith(str(target)), (key, seen[key])
    assert seen["top_level_api"] is False and seen["top_level_migrations"] is False
    assert "/schedules" in seen["routes"]
    assert seen["migrate"] == 0
    # The installed scripts are the repository's, their includes spliced as here.
    from periodic_manager.targets.redis import lua

    texts = [lua.script(*s) for s in scripts]
    assert not [t for t in texts if lua.INCLUDE in t]
    assert seen["lua"] == [hashlib.sha1(t.encode()).hexdigest() for t in texts]
    # The migrations the wheel carries built the schema: the table and the head revision exist.
    import sqlite3

    with sqlite3.connect(tmp_path / "fresh.db") as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        (revision,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
    assert "periodic_jobs" in tables
    heads = sorted(
        p.name for p in (ROOT / "migrations" / "versions").glob("*.py") if p.name[0].isdigit()
    )
    assert revision in heads[-1], (revision, heads[-1])
