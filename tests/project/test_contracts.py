"""The contracts are one package of one module per seam, imported from the package itself:
every public name of a seam's module is listed in its ``__all__`` and named by the package."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import periodic_manager.contracts as contracts

MODULES = [m.name for m in pkgutil.iter_modules(contracts.__path__)]


def public_names(path: Path) -> set[str]:
    """The names a module defines at its top level that do not start with an underscore."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def test_there_are_seams() -> None:
    assert {"clock", "providers", "targets", "store", "coordination"} <= set(MODULES)


def test_each_seam_lists_what_it_defines_and_the_package_names_it() -> None:
    seen: dict[str, str] = {}
    for name in MODULES:
        module = importlib.import_module(f"periodic_manager.contracts.{name}")
        assert module.__file__ is not None
        assert set(module.__all__) == public_names(Path(module.__file__)), name
        for public in module.__all__:
            assert public not in seen, f"{public} in {seen.get(public)} and {name}"
            seen[public] = name
            assert getattr(contracts, public) is getattr(module, public), public
