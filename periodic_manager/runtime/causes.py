"""Why a connection, a statement or a ping failed, in one line without the drivers' noise."""

from __future__ import annotations

import socket


def _root_cause(exc: BaseException) -> BaseException:
    """The most specific error behind SQLAlchemy's and the drivers' wrappers. A TimeoutError is
    a cause of its own: what it wraps (the CancelledError of ``asyncio.timeout``) says less. A
    socket error a client raised its own error while handling (redis-py's ConnectionError) is
    the cause too."""
    seen: set[int] = set()
    while id(exc) not in seen and not isinstance(exc, TimeoutError):
        seen.add(id(exc))
        context = exc.__context__ if isinstance(exc.__context__, OSError) else None
        inner = getattr(exc, "orig", None) or exc.__cause__ or context
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc


def explain(exc: BaseException, timeout_s: float | None = None) -> str:
    """One line saying why a connection or statement failed, without the driver's noise
    (``timeout_s``: the bound a timeout waited, said when known)."""
    cause = _root_cause(exc)
    if isinstance(cause, TimeoutError):
        return "no answer in time" if timeout_s is None else f"no answer within {timeout_s:.0f} s"
    if isinstance(cause, socket.gaierror):
        return f"cannot resolve the host ({cause.strerror or cause})"
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused (is the server running, on this host and port?)"
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror[0].lower() + cause.strerror[1:]
    text = str(cause).strip()
    first = text.splitlines()[0] if text else type(cause).__name__
    return first
