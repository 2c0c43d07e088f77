"""The shape every middleware of the app shares: it acts on the HTTP requests it is for, and
passes every other scope (the lifespan, another method or path) to the app untouched."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class HttpMiddleware:
    """ASGI middleware over ``app``: :meth:`http` answers the HTTP requests :meth:`handles`
    accepts (every one unless a subclass says otherwise); the rest go to ``app`` as they are."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.handles(scope):
            await self.http(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    def handles(self, scope: Scope) -> bool:
        """Whether this HTTP request is one :meth:`http` answers."""
        return True

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer an HTTP request this middleware handles (usually by calling ``self.app``)."""
        raise NotImplementedError
