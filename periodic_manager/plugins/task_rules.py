"""What each target refuses in a task whatever the moment it is sent: its write-time rules.

A target that refuses some tasks for what they are (RQ a ``task_type`` that is no dotted path,
Dramatiq a queue name it cannot declare, procrastinate a payload that is no object, arq a payload
key its ``enqueue_job`` keeps for itself) declares them next to its own enqueue code, as one
function at the end of its module::

    def task_problem(
        task_type: str, payload_json: str, options: Mapping[str, Any]
    ) -> TaskProblem | None: ...

It answers for a task that already passed every common check
(:mod:`periodic_manager.schedules.rules`): None when the target takes it, else the field at fault
(``task_type``, ``payload``, ``options.queue``) and why. The payload comes as its JSON text (the
form every caller holds: a manager's cold start judges every row, and a rule that does not read
the payload, or can tell from the text alone, never parses it).

A target declares where its rule lives in its plugin (``task_problem``,
``"module:function"``, :mod:`periodic_manager.targets.plugin`); the core asks :func:`rule_of`.
The module is imported on the first question about the target, not before (the settings and the
API name targets without loading any target's code).

Where the rules are applied: :func:`periodic_manager.schedules.rules.validate_task` (the API's
422 and the import's refusal, through ``PeriodicTaskConfig.create``) and the row judge
(:mod:`periodic_manager.db.judge`: a row error, the last good version keeps running).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from periodic_manager.plugins import installed


@dataclass(frozen=True, slots=True)
class TaskProblem:
    """Why a target refuses a task: the field at fault and the reason."""

    field: str
    reason: str


TaskRule = Callable[[str, str, Mapping[str, Any]], "TaskProblem | None"]

_loaded: dict[str, TaskRule | None] = {}


def rule_of(target: str) -> TaskRule | None:
    """The write-time rule ``target`` declares (None: it has none, or is not an installed
    target)."""
    try:
        return _loaded[target]
    except KeyError:
        pass
    path = _declared(target)
    rule: TaskRule | None = None
    if path is not None:
        rule = installed.load(path)
    _loaded[target] = rule
    return rule


@cache
def target_options() -> dict[str, tuple[str, ...]]:
    """The option keys each installed target declares it reads besides the core's, by key
    (a key two targets declare names both)."""
    found: dict[str, tuple[str, ...]] = {}
    for name in installed.names():
        for key in getattr(installed.declared(name), "options", ()):
            found[key] = (*found.get(key, ()), name)
    return found


def has_rules(targets: Any) -> bool:
    """Whether any of ``targets`` (names) declares a rule (none: nothing to ask per task)."""
    return any(_declared(name) is not None for name in targets)


def _declared(target: str) -> str | None:
    if target not in installed.names():
        return None
    path: str | None = installed.declared(target).task_problem
    return path
