"""Bearer-token authentication for every path but the probes ``/healthz`` and ``/readyz``.

With neither ``PM_API_TOKEN`` nor ``PM_API_READ_TOKEN`` set the API is open (and bound to
127.0.0.1 by default). With a token set, a request needs ``Authorization: Bearer <token>``: the
write token allows everything, the read token only GET and HEAD (403 otherwise). Tokens are
compared in constant time and never logged. Done as ASGI middleware so that it covers the OpenAPI
document, unknown paths (401 before 404: nothing is revealed) and ``/metrics`` alike.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from periodic_manager.runtime.startup import is_loopback
from periodic_manager.settings import Settings

from .errors import problem_response
from .middleware import HttpMiddleware

log = logging.getLogger(__name__)

# Probes: Kubernetes cannot send a secret header. /readyz tells which dependency is down, which
# an operator needs and an attacker gains little from.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
# The dashboard's shell and static files hold no data (its script reads the API with the token),
# and "/" only redirects to it. Every path under /ui/ is answered by the dashboard's router.
UI_PATHS = frozenset({"/", "/ui"})
UI_PREFIX = "/ui/"
READ_METHODS = frozenset({"GET", "HEAD"})


def _secret(value: Any) -> bytes | None:
    return value.get_secret_value().encode() if value is not None else None


def _matches(given: bytes, expected: bytes | None) -> bool:
    return expected is not None and hmac.compare_digest(given, expected)


def bearer_token(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return None
    return None


class BearerAuth(HttpMiddleware):
    """ASGI middleware enforcing the API tokens of ``settings``."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        super().__init__(app)
        self.write = _secret(settings.api_token)
        self.read = _secret(settings.api_read_token)

    def handles(self, scope: Scope) -> bool:
        path: str = scope["path"]
        return not (
            (self.write is None and self.read is None)
            or path in OPEN_PATHS
            or path in UI_PATHS
            or path.startswith(UI_PREFIX)
        )

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = bearer_token(scope)
        if token is not None:
            # Both comparisons always run, so timing does not tell which token came close.
            is_write = _matches(token, self.write)
            is_read = _matches(token, self.read)
            if is_write or (is_read and scope["method"] in READ_METHODS):
                await self.app(scope, receive, send)
                return
            if is_read:
                response = problem_response(
                    403, "forbidden", "the read-only token allows GET requests only"
                )
                await response(scope, receive, send)
                return
        log.debug("rejected %s %s: missing or invalid bearer token", scope["method"], scope["path"])
        response = problem_response(
            401,
            "unauthorized",
            "a valid 'Authorization: Bearer <token>' header is required",
            headers={"WWW-Authenticate": 'Bearer realm="periodic_manager"'},
        )
        await response(scope, receive, send)


def exposure(settings: Settings) -> str | None:
    """Why the API must not serve with these settings (None: it may): it binds beyond loopback
    and no token is set, so anyone who reaches it could edit schedules. ``run`` and ``api``
    refuse to start then; the message names the setting and how to fix it."""
    if settings.api_token is not None or settings.api_read_token is not None:
        return None
    if is_loopback(settings.host):
        return None
    return (
        f"PM_HOST: the API would bind to {settings.host} (beyond loopback) with no PM_API_TOKEN: "
        "anyone who reaches it could edit schedules; set PM_API_TOKEN to a long random secret "
        "(python3 -c 'import secrets; print(secrets.token_urlsafe(32))') or bind to 127.0.0.1"
    )


def warn_if_exposed(settings: Settings) -> bool:
    """Log a warning when the API is built with settings it must not serve (:func:`exposure`:
    the command refuses them; an app built in code only warns); True if it did."""
    why = exposure(settings)
    if why is not None:
        log.warning("%s", why)
        return True
    return False
