"""YAML for schedule files, safe against alias bombs.

PyYAML's safe loader shares aliased nodes, so a "billion laughs" document (each anchor a list of
ten aliases of the previous one) loads quickly into a small graph; it is everything after it
(validation, canonical JSON, hashing) that walks the expanded tree and grows without bound. So
before building Python objects, :func:`load` measures the tree the aliases would expand to, and
refuses a document whose aliases add more than :data:`MAX_ALIAS_NODES` nodes, or that refers to
itself, with one error.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

# Nodes aliases may add beyond the document's own: generous for sharing a payload between
# schedules, far below what would exhaust memory.
MAX_ALIAS_NODES = 100_000


class YamlBombError(ValueError):
    """The document's aliases expand too far, or form a cycle."""


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def check_aliases(root: Node) -> None:
    """Raise :class:`YamlBombError` when expanding every alias under ``root`` would add more
    than :data:`MAX_ALIAS_NODES` nodes, or when a node contains itself. Iterative, and each
    distinct node is visited once, however far the aliases would expand."""
    distinct = _distinct(root)
    limit = distinct + MAX_ALIAS_NODES
    sizes: dict[int, int] = {}  # node -> size of its expanded tree
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > limit:
                raise YamlBombError(
                    f"its aliases expand {distinct} nodes to more than {limit} (an alias bomb?)"
                )
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise YamlBombError("an alias refers to a node that contains it (a recursive document)")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)


def _distinct(root: Node) -> int:
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(_children(node))
    return len(seen)


def load(text: str) -> Any:
    """The one YAML document in ``text`` (None when empty), as ``yaml.safe_load`` would build it."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is None:
        return None
    check_aliases(root)
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(root)
    finally:
        loader.dispose()
