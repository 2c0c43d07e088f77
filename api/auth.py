"""Bearer-token authentication for every path but the probes ``/healthz`` and ``/readyz``.

With neither ``PM_API_TOKEN`` nor ``PM_API_READ_TOKEN`` set the API is open (and bound to
127.0.0.1 by default). With a token set, a request needs ``Authorization: Bearer <token>``: the
write token allows everything, the read token only GET and HEAD (403 otherwise). Tokens are
compared in constant time and never logged. Done as ASGI middleware so that it covers the OpenAPI
document, unknown paths (401 before 404: nothing is revealed) and ``/metrics`` alike.

Guessing is slowed down per client (its address): after ``GUESSES`` wrong tokens within
``GUESS_WINDOW_S``, every request of that client carrying a token is answered 429 until the
window ends, a right token included (else a 429 would tell a wrong guess from a right one).
A request without a token is not a guess (a dashboard asks first, then logs in).
"""

from __future__ import annotations

import hmac
import logging
import math
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from periodic_manager.contracts import Clock
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


# Wrong tokens a client may send within a window, the window, and how many clients are remembered.
GUESSES = 20
GUESS_WINDOW_S = 60.0
MAX_CLIENTS = 10_000


class Guesses:
    """Wrong tokens per client, in fixed windows of ``GUESS_WINDOW_S`` on ``clock``."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._seen: dict[str, tuple[float, int]] = {}  # client -> (window start, wrong tokens)

    def wait(self, client: str) -> float:
        """Seconds ``client`` must wait before its token is looked at again (0: none)."""
        seen = self._seen.get(client)
        if seen is None or seen[1] < GUESSES:
            return 0.0
        left = seen[0] + GUESS_WINDOW_S - self.clock.monotonic()
        if left <= 0:
            del self._seen[client]
            return 0.0
        return left

    def wrong(self, client: str) -> None:
        """Count a wrong token of ``client``; say so once it is held back (never the token)."""
        now = self.clock.monotonic()
        start, count = self._seen.get(client, (now, 0))
        if now - start >= GUESS_WINDOW_S:
            start, count = now, 0
        if len(self._seen) >= MAX_CLIENTS and client not in self._seen:
            self._seen.clear()  # a flood of addresses: forget them all rather than grow
        self._seen[client] = (start, count + 1)
        if count + 1 == GUESSES:
            log.warning(
                "%d wrong API tokens from %s within %.0f s: its requests with a token are "
                "answered 429 until the window ends",
                GUESSES,
                client,
                GUESS_WINDOW_S,
            )


def _client(scope: Scope) -> str:
    peer = scope.get("client")
    return str(peer[0]) if peer else "unknown"


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

    def __init__(self, app: ASGIApp, settings: Settings, clock: Clock) -> None:
        super().__init__(app)
        self.write = _secret(settings.api_token)
        self.read = _secret(settings.api_read_token)
        self.guesses = Guesses(clock)

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
            client = _client(scope)
            if (wait := self.guesses.wait(client)) > 0:
                response = problem_response(
                    429,
                    "too-many-requests",
                    f"too many wrong tokens from this client: retry in {math.ceil(wait)} s",
                    headers={"Retry-After": str(math.ceil(wait))},
                )
                await response(scope, receive, send)
                return
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
            self.guesses.wrong(client)
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
