"""The systemd units of deploy/systemd/: `systemd-analyze verify` clean, exposure at most 3.0
(`systemd-analyze security --offline=true`), their commands and settings the program's."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from periodic_manager.cli.main import _parser
from periodic_manager.settings import Settings
from tests.conftest import _unavailable
from tests.support import ROOT

SYSTEMD = ROOT / "deploy" / "systemd"
UNITS = sorted(SYSTEMD.glob("*.service"))
INSTALLED = "/opt/periodic-manager/bin/periodic-manager"
MAX_EXPOSURE = 3.0


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("systemd-analyze") is None:
        _unavailable("systemd-analyze", FileNotFoundError("systemd-analyze"))
    return subprocess.run(
        ["systemd-analyze", *args], capture_output=True, text=True, timeout=60, check=False
    )


def here(unit: Path, tmp_path: Path) -> Path:
    """The unit with its ExecStart on this checkout's command (verify checks that the program
    exists; the installed path is /opt/periodic-manager)."""
    program = str(Path(sys.executable).with_name("periodic-manager"))
    copy = tmp_path / unit.name
    copy.write_text(unit.read_text().replace(INSTALLED, program))
    return copy


def test_there_are_the_two_units_and_the_environment_file() -> None:
    assert [u.name for u in UNITS] == ["periodic-manager-api.service", "periodic-manager.service"]
    assert (SYSTEMD / "periodic-manager.env").is_file()


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_the_unit_verifies_clean(unit: Path, tmp_path: Path) -> None:
    checked = analyze("verify", str(here(unit, tmp_path)))
    assert checked.returncode == 0 and not checked.stderr.strip(), checked.stderr


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_the_unit_is_hardened(unit: Path, tmp_path: Path) -> None:
    checked = analyze("security", "--offline=true", "--no-pager", str(here(unit, tmp_path)))
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", checked.stdout)
    assert found, checked.stdout[-2000:] + checked.stderr
    assert float(found.group(1)) <= MAX_EXPOSURE, checked.stdout
    text = unit.read_text()
    for setting in ("DynamicUser=yes", "ProtectSystem=strict", "NoNewPrivileges=yes"):
        assert setting in text.splitlines(), setting


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_the_unit_runs_a_command_of_the_program_with_the_environment_file(unit: Path) -> None:
    lines = unit.read_text().splitlines()
    exec_start = [line.split("=", 1)[1] for line in lines if line.startswith("ExecStart=")]
    assert len(exec_start) == 1
    argv = shlex.split(exec_start[0])
    assert argv[0] == INSTALLED
    _parser().parse_args(argv[1:])  # a command the program has (SystemExit otherwise)
    assert "EnvironmentFile=/etc/periodic-manager/periodic-manager.env" in lines
    for line in lines:
        if line.startswith("Environment="):
            assert line.split("=", 2)[1].removeprefix("PM_").lower() in Settings.model_fields


def test_the_environment_file_names_settings_only() -> None:
    names = re.findall(r"^#?(PM_\w+)=", (SYSTEMD / "periodic-manager.env").read_text(), re.M)
    assert names and [n for n in names if n[3:].lower() not in Settings.model_fields] == []
