"""Whether a target can tell that a task finished, which ``options.overlap`` skip and hold need,
and whether it can tell that a task failed, which ``options.pause_after_failures`` needs: one
answer per target, used by the targets themselves, by the settings (the checks of the API, the
import and the provider) and by the manager's code API.

Light on purpose: the settings ask it without building (or importing) any target.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REDIS_NO_GROUP = (
    "no consumer group: set PM_REDIS_GROUP to the group your workers read with "
    "(examples/consume_redis.py --group)"
)
CELERY_NO_BACKEND = (
    "no result backend: set PM_CELERY_RESULT_BACKEND (or result_backend in your Celery app) to "
    "the one your workers write to"
)

DRAMATIQ_NO_RESULTS = (
    "Dramatiq deletes a message once a worker acknowledges it and records no outcome without its "
    "Results middleware, whose backend the dramatiq target does not read"
)


# Why a target cannot tell a failed task (options.pause_after_failures).
REDIS_NO_FAILURE = "a consumer group acknowledges a message whether its task succeeded or failed"
OUTBOX_NO_FAILURE = (
    "an outbox row records when it was processed (processed_at), not whether its task failed"
)
DRAMATIQ_NO_FAILURE = DRAMATIQ_NO_RESULTS


def redis(group: str | None) -> str | None:
    """Redis Streams: the consumer group's acknowledgements (None: it can tell)."""
    return None if group is not None else REDIS_NO_GROUP


def celery(has_result_backend: bool) -> str | None:
    """Celery: the result backend's ready states (None: it can tell)."""
    return None if has_result_backend else CELERY_NO_BACKEND


def dramatiq() -> str:
    """Dramatiq: cannot tell (no broker record of a finished message)."""
    return DRAMATIQ_NO_RESULTS


def asks(options: Mapping[str, Any]) -> bool:
    """Whether a schedule with these options needs a completion signal (overlap skip or hold)."""
    return options.get("overlap", "allow") != "allow"


def fails(options: Mapping[str, Any]) -> bool:
    """Whether a schedule with these options needs a failure signal (pause_after_failures)."""
    return "pause_after_failures" in options


def celery_failure(has_result_backend: bool) -> str | None:
    """Celery: the result backend's FAILURE state (None: it can tell)."""
    return None if has_result_backend else CELERY_NO_BACKEND
