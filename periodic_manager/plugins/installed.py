"""Which targets are installed: the names registered under the entry-point group :data:`GROUP`,
and the objects they name, loaded on the first question. Nothing here imports a target's code
(the schedules' checks ask it for names and write-time rules); the typed registry of plugins is
:mod:`periodic_manager.targets.registry`."""

from __future__ import annotations

import importlib
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

GROUP = "periodic_manager.targets"


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
def declared(name: str) -> Any:
    """The object the entry point ``name`` names (KeyError if none is installed)."""
    point = _entry_points()[name]
    found = point.load()
    if getattr(found, "name", None) != name:
        raise TypeError(
            f"entry point {point.value!r} of {GROUP} registers {name!r}: it must name a "
            f"TargetPlugin whose name is {name!r}"
        )
    return found


def load(path: str) -> Any:
    """The object ``"module:attribute"`` names, its module imported now: how a plugin's light
    declaration reaches its target's code (and its write-time rule) only when it is used."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)
