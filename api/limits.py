"""Request-shape middleware: a cap on the raw body size, and HEAD answered wherever GET is.

**Body size.** A declared ``Content-Length`` above ``PM_MAX_BODY_BYTES`` is answered 413 before a
byte of the body is read; a chunked body is counted as it arrives and refused with 413 as soon as
it passes the cap, so no request can make the API buffer more than the cap.

**HEAD.** FastAPI routes declare GET only; a HEAD request is served as the GET (same status and
headers, including ``Content-Length``) and its body is dropped.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import problem_response
from .middleware import HttpMiddleware


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when the body passes the cap. An HTTPException, so FastAPI's body
    reader re-raises it as it is (it turns other errors into 400) and the handlers answer 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes (PM_MAX_BODY_BYTES)")


class BodyLimit(HttpMiddleware):
    """ASGI middleware refusing request bodies larger than ``max_bytes`` with a 413 problem."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), None)
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                length = -1
            if length < 0:
                await problem_response(400, None, "invalid Content-Length")(scope, receive, send)
                return
            if length > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            # Read outside a route (a middleware, a mount): answer here if nothing was sent yet.
            if started:
                raise
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = f"the request body is larger than {self.max_bytes} bytes (PM_MAX_BODY_BYTES)"
        # Close the connection: the unread rest of the body must not be parsed as a request.
        response = problem_response(
            413, "payload-too-large", detail, headers={"Connection": "close"}
        )
        await response(scope, receive, send)


class HeadAsGet(HttpMiddleware):
    """ASGI middleware serving HEAD as GET without the body."""

    def handles(self, scope: Scope) -> bool:
        return bool(scope["method"] == "HEAD")

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def bodiless_send(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, bodiless_send)
