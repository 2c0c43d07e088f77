"""An answer the server can no longer send is the client's doing, not an error of ours.

The server finds a malformed request body (a chunked body that is not chunked, ...) only as it
reads it, while the app may already be answering the request without reading the body: the
browser guard refuses it, no route matches, auth asks for a token. The server then answers 400
itself, logs one line and closes the connection, and the app's answer fails in the server's
``send`` (uvicorn on h11: ``LocalProtocolError: can't handle event type Response when
role=SERVER and state=MUST_CLOSE``). Left alone, that exception is an "unhandled error" with two
tracebacks, ~60 log lines for one request anyone can send.

:class:`UnsentAnswers` catches a failure of an answer's *first* message (so nothing of the
answer went out), then waits a moment for the server to report the connection closed
(``http.disconnect``). If it does, the client already has the server's answer: one debug line,
no error. If it does not, the failure was something else, and it is raised as before.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import Message, Receive, Scope, Send

from .middleware import HttpMiddleware

log = logging.getLogger(__name__)

# How long the server may take to report the connection closed after refusing our answer (it
# closes it at once; this only bounds the wait when the failure had another cause).
DISCONNECT_WAIT_S = 2.0


class _StartRefused(Exception):
    """The server refused the first message of an answer; ``cause`` says how."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class UnsentAnswers(HttpMiddleware):
    """ASGI middleware: see the module docstring. Outermost of the app's own middleware."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def guarded_send(message: Message) -> None:
            if message["type"] != "http.response.start":
                await send(message)
                return
            try:
                await send(message)
            except Exception as exc:
                raise _StartRefused(exc) from exc

        try:
            await self.app(scope, receive, guarded_send)
        except _StartRefused as refused:
            if not await _closed(receive):
                raise refused.cause from None
            log.debug(
                "%s %s: the connection was answered and closed by the server before our answer "
                "(%s: %s)",
                scope["method"],
                scope["path"],
                type(refused.cause).__name__,
                refused.cause,
            )


async def _closed(receive: Receive) -> bool:
    """Whether the server reports the connection closed within :data:`DISCONNECT_WAIT_S` (what
    is left of the request body is read and dropped meanwhile)."""
    try:
        async with asyncio.timeout(DISCONNECT_WAIT_S):
            while (await receive())["type"] != "http.disconnect":
                pass
    except TimeoutError:
        return False
    return True
