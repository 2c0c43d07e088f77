"""Adding a target needs no edit of the core: every target, the built-in ones included, is found
through the entry-point group ``periodic_manager.targets``, and the core (everything outside
``periodic_manager/targets/``) never names one: no list of targets, no switch on a name."""

from __future__ import annotations

import ast
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

from periodic_manager.plugins import installed
from periodic_manager.plugins.installed import GROUP
from periodic_manager.settings import CoreSettings, Settings
from periodic_manager.targets import registry
from periodic_manager.targets.plugin import TargetPlugin

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ROOT / "periodic_manager" / "targets"
BUILTIN = TARGETS / "builtin"
CORE = [
    p
    for d in ("periodic_manager", "api")
    for p in sorted((ROOT / d).rglob("*.py"))
    if not p.is_relative_to(TARGETS)
]


def builtin_entry_points() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    points: dict[str, str] = project["entry-points"][GROUP]
    return points


def test_every_built_in_target_is_a_plugin_registered_like_any_other() -> None:
    points = builtin_entry_points()
    modules = {p.stem for p in BUILTIN.glob("*.py") if p.stem != "__init__"}
    # One module per built-in target, each registered, and nothing registered elsewhere.
    assert {v.partition(":")[0].rpartition(".")[2] for v in points.values()} <= modules
    assert all(v.startswith("periodic_manager.targets.builtin.") for v in points.values())
    registered = {p.name: p.value for p in entry_points(group=GROUP)}
    assert {n: registered.get(n) for n in points} == points  # reinstall after editing pyproject
    assert set(points) <= set(installed.names())
    for name in points:
        plugin = registry.plugin(name)
        assert isinstance(plugin, TargetPlugin) and plugin.name == name


def _protocol_word(path: Path, value: str) -> bool:
    """``"http"`` in the web app is the protocol (ASGI's scope type, a URL scheme, OpenAPI's
    security type), not the http target: the core outside api/ must not hold it either."""
    return value == "http" and path.is_relative_to(ROOT / "api")


def test_the_core_names_no_target() -> None:
    """No string of the core is a target's name (a list, a switch, a default aside from the
    documented ``PM_TARGET=outbox``)."""
    names = set(builtin_entry_points())
    found = []
    for path in CORE:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value in names and not _protocol_word(path, node.value):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    # The one name the core holds: the default of PM_TARGET, a documented setting's default.
    assert len(found) == 1 and found[0].startswith("periodic_manager/settings.py:"), found
    assert found[0].endswith(": 'outbox'"), found


def test_the_settings_of_the_targets_are_declared_by_their_plugins() -> None:
    declared: dict[str, str] = {}
    for plugin in registry.plugins():
        for field in plugin.settings.model_fields if plugin.settings else ():
            declared.setdefault(field, plugin.name)
    assert declared, "no plugin declares a setting"
    assert set(declared) <= set(Settings.model_fields)  # every plugin's setting is a setting
    assert not set(declared) & set(CoreSettings.model_fields)  # and none is the core's
    # docs/settings.md documents each of them (tests/project/test_docs.py checks every setting).
    doc = (ROOT / "docs" / "settings.md").read_text()
    assert [f for f in declared if f"`PM_{f.upper()}`" not in doc] == []
