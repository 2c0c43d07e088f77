"""Which scope every route needs: one table, enforced in one place.

:class:`api.auth.BearerAuth` says *who* calls (a :class:`Grant`: 401 before any route is looked
at, so an unknown path reveals nothing); :func:`require_scope`, a dependency of the whole app,
says *whether* that caller may call the route it reached (403 otherwise), before the route's
own parameters are read. A route missing from :data:`SCOPES` needs ``admin`` (closed by default);
``tests/api/test_api_keys.py`` walks every operation of the OpenAPI document against this table
with every scope, so a new route cannot be left out unnoticed. ``OPEN`` routes are those the
middleware lets through without a token (probes, the dashboard's shell and files).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from fastapi import Request
from starlette.types import Scope as AsgiScope

from periodic_manager.access import Scope

from .errors import ApiProblem

log = logging.getLogger(__name__)


class _Open:
    """The mark of a route that needs no token at all."""

    def __repr__(self) -> str:
        return "OPEN"


OPEN: Final = _Open()
READ, TRIGGER, WRITE, ADMIN = Scope.READ, Scope.TRIGGER, Scope.WRITE, Scope.ADMIN
S = "/schedules/{schedule_id}"

# (method, path template) -> the scope it needs. HEAD is answered as GET (api/limits.py).
SCOPES: dict[tuple[str, str], Scope | _Open] = {
    # Schedules: reading is read; pausing and resuming is trigger; the rest is write.
    ("GET", "/schedules"): READ,
    ("POST", "/schedules"): WRITE,
    ("GET", "/schedules/by-name/{name}"): READ,
    ("GET", S): READ,
    ("PATCH", S): WRITE,
    ("DELETE", S): WRITE,
    ("POST", f"{S}/pause"): TRIGGER,
    ("POST", f"{S}/resume"): TRIGGER,
    ("POST", f"{S}/trigger"): TRIGGER,
    ("POST", f"{S}/backfill"): TRIGGER,
    ("GET", f"{S}/runs"): READ,
    ("GET", f"{S}/changes"): READ,
    ("GET", f"{S}/stats"): READ,
    # The http target's dead letters: a replay sends tasks again (as a trigger does); a purge
    # deletes them for good (a write).
    ("GET", "/dead-letters"): READ,
    ("POST", "/dead-letters/{letter_id}/replay"): TRIGGER,
    ("POST", "/dead-letters/replay"): TRIGGER,
    ("POST", "/dead-letters/purge"): WRITE,
    # Calendars are shared by every schedule (every namespace, once there are namespaces).
    ("GET", "/calendars"): READ,
    ("GET", "/calendars/{name}"): READ,
    ("PUT", "/calendars/{name}"): ADMIN,
    ("DELETE", "/calendars/{name}"): ADMIN,
    ("GET", "/keys"): ADMIN,
    ("POST", "/keys"): ADMIN,
    ("DELETE", "/keys/{name}"): ADMIN,
    ("GET", "/entries"): READ,
    ("GET", "/managers"): READ,
    ("GET", "/cron/next"): READ,
    ("GET", "/metrics"): READ,
    ("GET", "/healthz"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", "/views/whoami"): READ,
    ("GET", "/views/schedules"): READ,
    ("GET", "/views/schedules/{schedule_id}/slots"): READ,
    ("GET", "/views/overview"): READ,
    ("GET", "/views/managers"): READ,
    ("GET", "/views/entries"): READ,
    ("GET", "/views/zones"): READ,
    # Not in the OpenAPI document: Swagger UI (its page and files) and the dashboard.
    ("GET", "/docs"): READ,
    ("GET", "/docs/assets/{name}"): READ,
    ("GET", "/"): OPEN,
    ("GET", "/ui"): OPEN,
    ("GET", "/ui/{path}"): OPEN,
    ("GET", "/ui/static/{tag}/{name}"): OPEN,
}
# Not a FastAPI route, so no dependency runs for it: any caller the middleware let in (read).
OPENAPI_PATH = "/openapi.json"


@dataclass(frozen=True, slots=True)
class Grant:
    """Who a request is: its scope and how it proved it (``key <name>``, ``PM_API_TOKEN``,
    ``PM_API_READ_TOKEN``, or ``open`` when the API asks for no token)."""

    scope: Scope
    via: str
    key_name: str | None = None


GRANT_KEY = "periodic_manager.grant"  # where BearerAuth puts the Grant in the ASGI scope
OPEN_GRANT = Grant(Scope.ADMIN, "open")


def unauthorized() -> ApiProblem:
    """The answer to a request without a valid token (the same wherever it is refused)."""
    return ApiProblem(
        401,
        "unauthorized",
        "a valid 'Authorization: Bearer <token>' header is required",
        headers={"WWW-Authenticate": 'Bearer realm="periodic_manager"'},
    )


def grant_of(scope: AsgiScope) -> Grant | None:
    """The caller of a request, as the middleware found it (None: it did not look)."""
    grant = scope.get(GRANT_KEY)
    return grant if isinstance(grant, Grant) else None


def needed(method: str, path: str) -> Scope | _Open:
    """The scope route ``(method, path template)`` needs (``admin`` when it is not listed)."""
    return SCOPES.get(("GET" if method == "HEAD" else method, path), ADMIN)


async def require_scope(request: Request) -> None:
    """The app's one authorization check (a dependency of every FastAPI route)."""
    route = request.scope.get("route")
    # The template without converters ("{name:path}" -> "{name}"), as the OpenAPI document has it.
    path = str(getattr(route, "path_format", request.url.path))
    need = needed(request.method, path)
    if isinstance(need, _Open):
        return
    grant = grant_of(request.scope)
    if grant is None:  # a path the middleware let through unseen must not reach a closed route
        raise unauthorized()
    if not grant.scope.allows(need):
        log.debug("refused %s %s to %s: needs %s", request.method, path, grant.via, need)
        raise ApiProblem(
            403,
            "forbidden",
            f"{request.method} {path} needs scope {need.value}; this caller has {grant.scope.value}",
        )
