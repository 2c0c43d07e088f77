"""The optional targets' libraries: which extra installs each, and the one error when missing."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from periodic_manager.errors import TargetError

# Targets that need an optional extra: target -> (module to import, extra to install).
TARGET_EXTRAS = {
    "celery": ("celery", "celery"),
    "arq": ("arq", "arq"),
    "rq": ("rq", "rq"),
    "dramatiq": ("dramatiq", "dramatiq"),
    "procrastinate": ("procrastinate", "procrastinate"),
}


def needs(target: str) -> str:
    """What ``target`` needs installed, as one line naming the extra."""
    module, extra = TARGET_EXTRAS[target]
    return f"the {target} target needs {module}: pip install 'periodic-manager[{extra}]'"


def missing(target: str) -> str | None:
    """Why ``target`` cannot be built here (its library is not installed), or None."""
    module, _ = TARGET_EXTRAS.get(target, (None, None))
    if module is None or importlib.util.find_spec(module) is not None:
        return None
    return needs(target)


def load(target: str, module: str) -> Any:
    """Import ``module`` of ``target``'s library (TargetError naming the extra if missing)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise TargetError(needs(target)) from exc
