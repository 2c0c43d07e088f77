"""The one registry of targets: the plugins installed under the entry-point group
:data:`~periodic_manager.targets.plugin.GROUP`, the built-in ones included.

The core asks it by name and never names a target itself. Entry points are read once per
process (a plugin installed while a process runs is seen by the next one).
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pydantic import BaseModel

from periodic_manager.targets.plugin import GROUP, TargetPlugin


class UnknownTarget(ValueError):
    """A name no installed plugin registers; the message names the installed ones."""


@cache
def _entry_points() -> dict[str, EntryPoint]:
    return {point.name: point for point in entry_points(group=GROUP)}


def names() -> tuple[str, ...]:
    """The names of every installed target, sorted."""
    return tuple(sorted(_entry_points()))


def unknown(name: object) -> str:
    """One line saying ``name`` is no installed target, naming the installed ones."""
    return f"unknown target {name!r}: the installed targets are {', '.join(names())}"


@cache
def plugin(name: str) -> TargetPlugin[Any]:
    """The plugin registered as ``name`` (:class:`UnknownTarget` if none is)."""
    point = _entry_points().get(name)
    if point is None:
        raise UnknownTarget(unknown(name))
    found = point.load()
    if not isinstance(found, TargetPlugin) or found.name != name:
        raise TypeError(
            f"entry point {point.value!r} of {GROUP} registers {name!r}: it must name a "
            f"TargetPlugin whose name is {name!r}"
        )
    return found


def plugins() -> tuple[TargetPlugin[Any], ...]:
    """Every installed plugin, by name."""
    return tuple(plugin(name) for name in names())


def settings_models() -> tuple[type[BaseModel], ...]:
    """The settings models of every installed plugin, each once, a model another one extends
    left out (its fields come with the extension)."""
    models = list(dict.fromkeys(p.settings for p in plugins() if p.settings is not None))
    return tuple(m for m in models if not any(o is not m and issubclass(o, m) for o in models))
