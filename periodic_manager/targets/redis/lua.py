"""Lua scripts kept as ``.lua`` files in a ``scripts`` folder beside the Python that runs them,
and the one reading of what they (or Redis) return as text (:func:`text`).

:func:`script` returns the exact text sent to Redis (``SCRIPT LOAD``, or redis-py's
``register_script``), so the SHA of that text is the one Redis knows. A line
``--#include <file>`` is replaced by that file of the same folder, and
``--#include <package>:<file>`` by that file of another package's ``scripts`` folder: a fragment
shared by two scripts is written once (every claim script starts with
``periodic_manager.targets.redis:prelude.lua``: the flags and the checks they share).
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable

INCLUDE = "--#include "


def text(value: object) -> str:
    """A value Redis returned (a script's reply, a GET), as text: bytes decoded, None as ``""``."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def script(package: str, name: str) -> str:
    """The text of ``scripts/<name>`` in ``package`` (a dotted package name), includes spliced.
    Read once, at the import of the module that runs it."""
    return _spliced(_folder(package), name)


def _folder(package: str) -> Traversable:
    return resources.files(package).joinpath("scripts")


def _spliced(folder: Traversable, name: str) -> str:
    lines = folder.joinpath(name).read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(
        _included(folder, line.strip().removeprefix(INCLUDE))
        if line.lstrip().startswith(INCLUDE)
        else line
        for line in lines
    )


def _included(folder: Traversable, name: str) -> str:
    package, _, file = name.rpartition(":")
    return _spliced(_folder(package) if package else folder, file)
