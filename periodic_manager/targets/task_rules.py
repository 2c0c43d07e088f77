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

:data:`DECLARED` is the one registry: every target name maps to the module that declares its
rule, or None for a target with no rule of its own (the common checks are all it needs). The
core asks :func:`rule_of`; a target module is imported on the first question about it, not
before (the settings and the API name targets without loading any).

Where the rules are applied: :func:`periodic_manager.schedules.rules.validate_task` (the API's
422 and the import's refusal, through ``PeriodicTaskConfig.create``) and the row judge
(:mod:`periodic_manager.db.judge`: a row error, the last good version keeps running).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class TaskProblem:
    """Why a target refuses a task: the field at fault and the reason."""

    field: str
    reason: str


TaskRule = Callable[[str, str, Mapping[str, Any]], "TaskProblem | None"]

# Every target and the module whose ``task_problem`` states its rules (None: no rule of its own).
# redis and outbox take any task the common checks pass (their queue and task_type limits are
# the columns' and the stream key's, checked for every schedule). celery's refusals depend on
# your Celery app (its routes, task_create_missing_queues), which the API does not load: they are
# reported when a task is sent.
DECLARED: dict[str, str | None] = {
    "redis": None,
    "outbox": None,
    "celery": None,
    "arq": "periodic_manager.targets.arq",
    "rq": "periodic_manager.targets.rq",
    "dramatiq": "periodic_manager.targets.dramatiq",
    "procrastinate": "periodic_manager.targets.procrastinate",
}

_loaded: dict[str, TaskRule | None] = {}


def rule_of(target: str) -> TaskRule | None:
    """The write-time rule ``target`` declares (None: it has none, or is not a known target)."""
    try:
        return _loaded[target]
    except KeyError:
        pass
    module = DECLARED.get(target)
    rule: TaskRule | None = None
    if module is not None:
        rule = importlib.import_module(module).task_problem
    _loaded[target] = rule
    return rule


def has_rules(targets: Any) -> bool:
    """Whether any of ``targets`` (names) declares a rule (none: nothing to ask per task)."""
    return any(DECLARED.get(name) is not None for name in targets)
