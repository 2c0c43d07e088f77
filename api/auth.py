"""Bearer-token authentication for every path but the probes ``/healthz`` and ``/readyz``.

With neither ``PM_API_TOKEN`` nor ``PM_API_READ_TOKEN`` set and no API key made, the API is open
(and bound to 127.0.0.1 by default). Otherwise a request needs ``Authorization: Bearer <token>``:
``PM_API_TOKEN`` is an admin, ``PM_API_READ_TOKEN`` a global read key, and an API key
(``pmk_...``, rows of ``pm_api_keys``: :mod:`periodic_manager.access`) has its own scope. This
module finds *who* calls (a :class:`~api.scopes.Grant`, put in the ASGI scope); what each route
needs is ``api/scopes.py``. Tokens and key digests are compared in constant time and never
logged. Done as ASGI middleware so that it covers the OpenAPI document, unknown paths (401 before
404: nothing is revealed) and ``/metrics`` alike.

Guessing is slowed down per client (its address): after ``GUESSES`` wrong tokens within
``GUESS_WINDOW_S``, every request of that client carrying a token is answered 429 until the
window ends, a right token included (else a 429 would tell a wrong guess from a right one).
A request without a token is not a guess (a dashboard asks first, then logs in).
"""

from __future__ import annotations

import hmac
import logging
import math
from datetime import datetime
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from periodic_manager.access import Scope as KeyScope
from periodic_manager.access import digest, split_key
from periodic_manager.contracts import Clock
from periodic_manager.db import api_keys
from periodic_manager.db.engine import Engine
from periodic_manager.runtime.startup import is_loopback
from periodic_manager.settings import Settings

from .errors import ApiProblem, problem_response
from .middleware import HttpMiddleware
from .scopes import GRANT_KEY, OPEN_GRANT, Grant, unauthorized
from .state import AppState

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
# While no API key exists (and no token is set), look again this often whether one was made.
KEYS_RECHECK_S = 1.0


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
            self._forget_one(now)
        self._seen[client] = (start, count + 1)
        if count + 1 == GUESSES:
            log.warning(
                "%d wrong API tokens from %s within %.0f s: its requests with a token are "
                "answered 429 until the window ends",
                GUESSES,
                client,
                GUESS_WINDOW_S,
            )

    def _forget_one(self, now: float) -> None:
        """Room for one more client: the ones whose window ended go, else the oldest one (a
        flood of addresses must not wipe every client held back, nor grow the table)."""
        ended = [c for c, (start, _) in self._seen.items() if now - start >= GUESS_WINDOW_S]
        for c in ended:
            del self._seen[c]
        if not ended:
            del self._seen[next(iter(self._seen))]


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
    """ASGI middleware: who a request is (:class:`~api.scopes.Grant`), or 401/429/503.

    Auth is on when ``PM_API_TOKEN`` or ``PM_API_READ_TOKEN`` is set, or once any API key was
    made (revoked keys count: revoking the last key must not open the API). Whether a key exists
    is asked of the database at most every ``KEYS_RECHECK_S`` while there is none, and never
    again once there is one. A key is read from the database on every request (by primary key,
    no cache), so a revoked or expired key is refused from the next request in every process.
    What the grant may do is decided after routing, by :func:`api.scopes.require_scope`.
    """

    def __init__(self, app: ASGIApp, settings: Settings, state: AppState) -> None:
        super().__init__(app)
        self.write = _secret(settings.api_token)
        self.read = _secret(settings.api_read_token)
        self.state = state
        self.guesses = Guesses(state.clock)
        self._looked_at: float | None = None  # monotonic time keys were last found missing

    def handles(self, scope: Scope) -> bool:
        path: str = scope["path"]
        return not (path in OPEN_PATHS or path in UI_PATHS or path.startswith(UI_PREFIX))

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            on = await self.auth_on()
            grant = OPEN_GRANT if not on else await self._grant(scope)
        except ApiProblem as exc:
            response = problem_response(exc.status, exc.slug, exc.detail, headers=exc.headers)
            await response(scope, receive, send)
            return
        scope[GRANT_KEY] = grant
        await self.app(scope, receive, send)

    async def auth_on(self) -> bool:
        """Whether requests need a token: one is set, or an API key exists."""
        if self.write is not None or self.read is not None or self.state.keys_seen:
            return True
        now = self.state.clock.monotonic()
        if self._looked_at is not None and now - self._looked_at < KEYS_RECHECK_S:
            return False
        self._looked_at = now  # one look a window, however many requests arrive at once
        try:
            async with self.state.database.connect() as conn:
                self.state.keys_seen = await api_keys.any_key(conn)
        except (SQLAlchemyError, OSError) as exc:
            self._looked_at = None  # asked again by the next request
            log.warning("cannot tell whether API keys exist: %s", type(exc).__name__)
            raise ApiProblem(
                503, "unavailable", "cannot check API keys: database unavailable"
            ) from None
        return self.state.keys_seen

    async def _grant(self, scope: Scope) -> Grant:
        token = bearer_token(scope)
        if token is None:
            log.debug("rejected %s %s: no bearer token", scope["method"], scope["path"])
            raise unauthorized()
        client = _client(scope)
        if (wait := self.guesses.wait(client)) > 0:
            raise ApiProblem(
                429,
                "too-many-requests",
                f"too many wrong tokens from this client: retry in {math.ceil(wait)} s",
                headers={"Retry-After": str(math.ceil(wait))},
            )
        # Both comparisons always run, so timing does not tell which token came close.
        is_write = _matches(token, self.write)
        is_read = _matches(token, self.read)
        if is_write:
            return Grant(KeyScope.ADMIN, "PM_API_TOKEN")
        if is_read:
            return Grant(KeyScope.READ, "PM_API_READ_TOKEN")
        grant = await self._key_grant(token)
        if grant is None:
            self.guesses.wrong(client)
            log.debug("rejected %s %s: invalid bearer token", scope["method"], scope["path"])
            raise unauthorized()
        return grant

    async def _key_grant(self, token: bytes) -> Grant | None:
        """The grant of an API key: read by its id, its secret's digest compared in constant
        time; None for a key that is unknown, wrong, revoked, expired or of no known scope."""
        parts = split_key(token.decode("ascii", "replace"))
        if parts is None:
            return None
        key_id, secret = parts
        now = self.state.clock.now()
        try:
            async with self.state.database.connect() as conn:
                key = await api_keys.by_id(conn, key_id)
                if key is None:
                    return None
                if not hmac.compare_digest(digest(secret).encode(), key.secret_sha256.encode()):
                    # Debug only: key ids are not secret, so a line per try could flood the log
                    # (the guesses of a client are said once, by Guesses.wrong).
                    log.debug("wrong secret for API key %s (%s)", key.name, key_id)
                    return None
                why = "no known scope" if key.scope is None else key.state(now)
                if key.scope is None or why != "active":
                    log.info("refused API key %s (%s): %s", key.name, key_id, why)
                    return None
                await _touch(conn, key, now)
        except (SQLAlchemyError, OSError) as exc:
            log.warning("cannot check API key %s: %s", key_id, type(exc).__name__)
            raise ApiProblem(
                503, "unavailable", "cannot check API keys: database unavailable"
            ) from None
        return Grant(key.scope, f"key {key.name}", key.name)


async def _touch(conn: AsyncConnection, key: api_keys.StoredKey, now: datetime) -> None:
    """Record the key's use; a write that fails (a busy SQLite file) must not refuse the
    request its key has already been checked for: the next use a minute later tries again."""
    try:
        await api_keys.touch(conn, key, now)
    except SQLAlchemyError as exc:
        log.warning("cannot record the use of API key %s: %s", key.name, type(exc).__name__)


def exposure(settings: Settings, *, admin_key: bool = False) -> str | None:
    """Why the API must not serve with these settings (None: it may): it binds beyond loopback
    and no token is set and (``admin_key`` False) no active admin key exists, so anyone who
    reaches it could edit schedules. ``run`` and ``api`` refuse to start then; the message names
    the setting and how to fix it. The command asks the database for ``admin_key`` only when
    the settings alone would refuse (:func:`periodic_manager.cli.main._serve`)."""
    if settings.api_token is not None or settings.api_read_token is not None or admin_key:
        return None
    if is_loopback(settings.host):
        return None
    return (
        f"PM_HOST: the API would bind to {settings.host} (beyond loopback) with no PM_API_TOKEN "
        "and no active admin key: anyone who reaches it could edit schedules; create the first "
        "admin key with `periodic-manager keys create --name admin --scope admin`, or set "
        "PM_API_TOKEN to a long random secret, or bind to 127.0.0.1"
    )


async def admin_key_in(engine: Engine, now: datetime) -> bool:
    """Whether the database of ``engine`` holds an active admin key (:func:`exposure`); a
    database that cannot be asked (down, not migrated) holds none."""
    try:
        async with engine.connect() as conn:
            return await api_keys.active_admin(conn, now)
    except (SQLAlchemyError, OSError):
        return False


def warn_if_exposed(settings: Settings, *, admin_key: bool = False) -> bool:
    """Log a warning when the API is built with settings it must not serve (:func:`exposure`:
    the command refuses them; an app built in code only warns); True if it did."""
    why = exposure(settings, admin_key=admin_key)
    if why is not None:
        log.warning("%s", why)
        return True
    return False
