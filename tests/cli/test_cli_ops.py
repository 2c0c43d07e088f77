"""The command line itself: help, per-command flags, the metrics port's bind, YAML alias bombs."""

from __future__ import annotations

import logging
import re
import resource
import socket
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from periodic_manager.cli.arguments import COMMANDS
from periodic_manager.cli.main import _start_metrics, main
from periodic_manager.runtime.startup import StartupError
from periodic_manager.schedules.yaml_load import MAX_ALIAS_NODES, YamlBombError, load
from periodic_manager.settings import Settings
from periodic_manager.urls import redact_url
from tests.support.servers import free_port


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's --help and usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_bare_command_prints_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys)
    assert code == 2 and out.startswith("usage: periodic-manager")
    for command in (*COMMANDS, "next", "health"):
        assert re.search(rf"^\s+{command}\s+\S", out, re.M), command  # listed with its description


EXPECTED_FLAGS = {
    "run": {
        "--database-url",
        "--redis-url",
        "--target",
        "--sync-interval",
        "--grace",
        "--host",
        "--port",
        "--log-level",
        "--log-format",
    },
    "manager": {
        "--database-url",
        "--redis-url",
        "--target",
        "--sync-interval",
        "--grace",
        "--log-level",
        "--log-format",
    },
    "api": {
        "--database-url",
        "--redis-url",
        "--target",
        "--grace",
        "--host",
        "--port",
        "--log-level",
        "--log-format",
    },
    "migrate": {"--database-url", "--log-level", "--log-format"},
    "import": {"--database-url", "--log-level", "--log-format", "--format", "--dry-run", "--prune"},
    "export": {"--database-url", "--log-level", "--log-format", "--format"},
    "health": {"--role", "--probe-dir", "--max-age"},
    "next": {
        "--tz",
        "-n",
        "--anchor",
        "--start-at",
        "--end-at",
        "--max-runs",
        "--describe",
        "--exclude-dates",
        "--exclude-holidays",
    },
}


@pytest.mark.parametrize("command", sorted(EXPECTED_FLAGS))
def test_each_command_lists_only_the_flags_it_uses(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    options = out.split("options:", 1)[1]
    flags = set(re.findall(r"^\s+(-{1,2}[a-z][a-z-]*)", options, re.M)) - {"-h", "--help"}
    assert flags == EXPECTED_FLAGS[command]
    description = " ".join(out.split("\n\n")[1].split())  # argparse may wrap it
    assert description == COMMANDS[command][0] if command in COMMANDS else len(description) > 20


def test_a_flag_another_command_uses_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "manager", "--port", "8001")
    assert code == 2 and "unrecognized arguments: --port 8001" in err
    code, _, err = run(capsys, "migrate", "--target", "redis")
    assert code == 2 and "unrecognized arguments" in err


class _Metered:
    def __init__(self) -> None:
        self.metrics = type("M", (), {"registry": CollectorRegistry()})()


def test_metrics_port_binds_to_loopback_unless_told(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    server = _start_metrics(Settings(metrics_port=port), _Metered())
    try:
        assert server.server_address == ("127.0.0.1", port)
        with pytest.raises(
            StartupError, match=rf"PM_METRICS_PORT: cannot listen on 127.0.0.1:{port}"
        ):
            _start_metrics(Settings(metrics_port=port), _Metered())
    finally:
        server.shutdown()
        server.server_close()
    with caplog.at_level(logging.WARNING):
        server = _start_metrics(
            Settings(metrics_port=free_port(), metrics_host="0.0.0.0"), _Metered()
        )
    try:
        assert server.server_address[0] == "0.0.0.0"
        assert "have no authentication" in caplog.text
    finally:
        server.shutdown()
        server.server_close()


def test_urls_are_shown_without_their_password() -> None:
    assert redact_url("postgresql://u:p4ss@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact_url("redis://:p4ss@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url("amqp://guest:p4ss@broker//") == "amqp://guest:***@broker//"
    assert redact_url("sqlite:///./pm.db") == "sqlite:///./pm.db"


BOMB = "\n".join(
    [
        'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]',
        *(
            f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]"
            for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
        ),
        'schedules: [{name: x, spec: "@daily", task_type: t, payload: *i}]',
    ]
)


def test_a_yaml_alias_bomb_fails_fast_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """9^9 (387 million) strings once expanded: refused before anything walks them."""
    f = tmp_path / "bomb.yaml"
    f.write_text(BOMB)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    code, out, err = run(capsys, "import", str(f), "--database-url", f"sqlite:///{tmp_path}/x.db")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert (
        line.startswith(f"periodic-manager: error: {f}: not valid YAML: ") and "alias bomb" in line
    )
    assert grown_mib < 200, f"loading the bomb grew the process by {grown_mib:.0f} MiB"
    assert not (tmp_path / "x.db").exists()


def test_yaml_aliases_within_bounds_load_like_safe_load() -> None:
    text = (
        "- {name: a, spec: '@daily', task_type: t, payload: &p {format: pdf, pages: [1, 2]}}\n"
        "- {name: b, spec: '@daily', task_type: t, payload: *p}\n"
    )
    assert load(text) == yaml.safe_load(text)
    assert load("") is None and load("# nothing\n") is None
    wide = "base: &b [" + ", ".join(["1"] * 1000) + "]\nuses: [" + ", ".join(["*b"] * 50) + "]\n"
    assert load(wide) == yaml.safe_load(wide)  # 50,000 nodes through aliases: allowed
    too_wide = (
        "base: &b ["
        + ", ".join(["1"] * 1000)
        + "]\nmore: ["
        + ", ".join(["*b"] * (MAX_ALIAS_NODES // 1000 + 1))
        + "]\n"
    )
    with pytest.raises(YamlBombError, match="alias bomb"):
        load(too_wide)


def test_a_recursive_or_deep_yaml_document_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(YamlBombError, match="recursive"):
        load("a: &a [1, *a]")
    for name, text in [
        ("rec.yaml", "&s [{name: x, spec: '@daily', task_type: t, payload: *s}]"),
        ("deep.yaml", "[" * 100_000 + "]" * 100_000),
    ]:
        f = tmp_path / name
        f.write_text(text)
        code, _, err = run(
            capsys, "import", str(f), "--dry-run", "--database-url", f"sqlite:///{tmp_path}/x.db"
        )
        assert code == 2 and len(err.strip().splitlines()) == 1, err[-500:]


def test_bind_failure_is_a_startup_error() -> None:
    from periodic_manager.cli.main import bind_socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(StartupError, match=f"cannot listen on 127.0.0.1:{port}"):
            bind_socket("127.0.0.1", port)
    with pytest.raises(StartupError, match="cannot resolve"):
        bind_socket("no-such-host.invalid", 0)
