"""The one registry of targets: the plugins installed under the entry-point group
``periodic_manager.targets`` (:mod:`~periodic_manager.plugins.installed`), the built-in ones
included.

The core asks it by name and never names a target itself. Entry points are read once per
process (a plugin installed while a process runs is seen by the next one).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel

from periodic_manager.plugins import installed
from periodic_manager.targets.plugin import TargetPlugin


class UnknownTarget(ValueError):
    """A name no installed plugin registers; the message names the installed ones."""


@cache
def plugin(name: str) -> TargetPlugin[Any]:
    """The plugin registered as ``name`` (:class:`UnknownTarget` if none is)."""
    if name not in installed.names():
        raise UnknownTarget(installed.unknown(name))
    found = installed.declared(name)
    if not isinstance(found, TargetPlugin):
        raise TypeError(f"the target {name!r} is registered with no TargetPlugin: {found!r}")
    return found


def plugins() -> tuple[TargetPlugin[Any], ...]:
    """Every installed plugin, by name."""
    return tuple(plugin(name) for name in installed.names())


def settings_models() -> tuple[type[BaseModel], ...]:
    """The settings models of every installed plugin, each once, a model another one extends
    left out (its fields come with the extension)."""
    models = list(dict.fromkeys(p.settings for p in plugins() if p.settings is not None))
    return tuple(m for m in models if not any(o is not m and issubclass(o, m) for o in models))
