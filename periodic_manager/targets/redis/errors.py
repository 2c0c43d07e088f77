"""One translation of a Redis failure into :class:`~periodic_manager.errors.TargetError`.

Every target that talks to Redis wraps its awaited calls (not its per-task work) in
:func:`redis_errors`, so a failure reads the same wherever it happened::

    <what>: <Type>: <message>          a Redis error, or the connection's (refused, reset, ...)
    <what>: no answer within <t> s     the call's own bound (``asyncio.timeout``) or the client's
                                       socket timeout (the same bound) ran out
    <what>: WRONGTYPE <key> is a <type>, not a <type>
                                       a script's up-front type check refused the whole call
                                       (:class:`KeyTypeError`)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import RedisClusterException, RedisError, ResponseError
from redis.exceptions import TimeoutError as SocketTimeout

from periodic_manager.errors import TargetError, TaskRefused

# How a script refuses a call whose shared key (a queue, a stream, a binding set) holds another
# Redis type, before it writes anything (claim_and_push.lua, arq_claim_and_write.lua,
# claim_and_add*.lua). Redis's own WRONGTYPE ("Operation against a key holding the wrong kind of
# value") is a command failing inside a script: not this.
_REFUSED = re.compile(r"WRONGTYPE .* is an? [a-z]+, not an? [a-z ]+", re.DOTALL)


class KeyTypeError(TaskRefused):
    """A script refused its whole call, before writing anything, because a key that every task
    of the call writes holds another Redis type: that call's tasks fail, the others go on. No
    retry mends it (someone must delete or rename the key): a refusal for good."""


def key_type_refusal(what: str, exc: BaseException) -> KeyTypeError | None:
    """``exc`` as a KeyTypeError when it is a script's refusal of a key of another type (a
    failure no retry mends), else None."""
    if isinstance(exc, ResponseError) and _REFUSED.fullmatch(str(exc)):
        return KeyTypeError(f"{what}: {exc}")
    return None


@contextmanager
def redis_errors(what: str, timeout: float | None = None) -> Iterator[None]:
    """Raise what Redis raises inside as TargetError (its cause kept), or as KeyTypeError for a
    script's refusal of a key of another type. ``timeout``: the bound of the calls inside, named
    in the message when it runs out (None: not known here)."""
    try:
        yield
    except (TimeoutError, SocketTimeout) as exc:  # before OSError and RedisError, their bases
        # The client's socket timeout is the same bound as the call's (the targets set both to
        # ``timeout``): whichever runs out first, the message is the same.
        if timeout is None:
            raise TargetError(f"{what}: {type(exc).__name__}: {exc}") from exc
        raise TargetError(f"{what}: no answer within {timeout:g} s") from exc
    except ResponseError as exc:
        refusal = key_type_refusal(what, exc)
        if refusal is not None:
            raise refusal from exc
        raise TargetError(f"{what}: {type(exc).__name__}: {exc}") from exc
    except (RedisError, RedisClusterException, OSError) as exc:  # the cluster client's own
        raise TargetError(f"{what}: {type(exc).__name__}: {exc}") from exc
