"""One translation of a Redis failure into :class:`~periodic_manager.errors.TargetError`.

Every target that talks to Redis wraps its awaited calls (not its per-task work) in
:func:`redis_errors`, so a failure reads the same wherever it happened::

    <what>: <Type>: <message>          a Redis error, or the connection's (refused, reset, ...)
    <what>: no answer within <t> s     the call's own bound (``asyncio.timeout``) ran out
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import RedisError

from periodic_manager.errors import TargetError


@contextmanager
def redis_errors(what: str, timeout: float | None = None) -> Iterator[None]:
    """Raise what Redis raises inside as TargetError (its cause kept). ``timeout``: the bound of
    the calls inside, named in the message when it runs out (None: not known here)."""
    try:
        yield
    except TimeoutError as exc:  # before OSError, whose subclass it is
        if timeout is None:
            raise TargetError(f"{what}: {type(exc).__name__}: {exc}") from exc
        raise TargetError(f"{what}: no answer within {timeout:g} s") from exc
    except (RedisError, OSError) as exc:
        raise TargetError(f"{what}: {type(exc).__name__}: {exc}") from exc
