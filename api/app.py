"""The application factory. Nothing is built at import time: engine, clock and manager come from
``create_app``'s arguments or are made in the lifespan, which also owns an in-process manager."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi

import periodic_manager
from periodic_manager.clock import SystemClock
from periodic_manager.contracts import Clock, ManagerHandle
from periodic_manager.db.engine import Engine, create_engine
from periodic_manager.settings import Settings

from .auth import OPEN_PATHS, BearerAuth, admin_key_in, exposure, warn_if_exposed
from .errors import PROBLEM_MEDIA_TYPE, install_error_handlers
from .guard import (
    ANY_HOST_PATHS,
    SAFE_METHODS,
    BrowserGuard,
    NoFraming,
    warn_if_unreachable_by_name,
)
from .limits import BodyLimit, HeadAsGet
from .routes import (
    calendars,
    changes,
    cron,
    dead_letters,
    docs,
    entries,
    health,
    keys,
    managers,
    runs,
    schedules,
    views,
)
from .schemas import Problem
from .scopes import require_scope
from .state import AppState, state_of
from .ui.shell import ui_router
from .unsent import UnsentAnswers

if TYPE_CHECKING:
    from periodic_manager.tracing.otel import SlotTracing

DESCRIPTION = (
    "Edit periodic schedules (rows of `periodic_jobs`) and inspect what running managers "
    "registered. Errors are RFC 9457 problem details (`application/problem+json`)."
)


# The route modules, in the order their paths are documented.
ROUTES = (
    schedules,
    calendars,
    keys,
    runs,
    changes,
    entries,
    managers,
    dead_letters,
    cron,
    health,
    docs,
    views,
)


def create_app(
    settings: Settings,
    *,
    clock: Clock | None = None,
    engine: Engine | None = None,
    manager_factory: Callable[[Engine], ManagerHandle] | None = None,
    tracing: SlotTracing | None = None,
) -> FastAPI:
    """Build the API.

    ``engine``: use this engine (the caller disposes it); otherwise one is made from
    ``settings.database_url`` at startup and disposed at shutdown. ``manager_factory``: build an
    in-process manager from the engine; it is started before serving, stopped at shutdown and
    asked to sync after every successful write. What the app holds: :func:`api.state.state_of`.
    ``settings.otel``: requests are traced through ``tracing`` (default: one started from the
    ``OTEL_*`` variables).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        warn_if_unreachable_by_name(settings)
        state = state_of(app)
        async with AsyncExitStack() as stack:
            eng = engine
            if eng is None:
                eng = create_engine(settings.database_url)
                stack.push_async_callback(eng.dispose)
            state.engine = eng
            # Beyond loopback with no token, an active admin key in the database is enough.
            warn_if_exposed(settings, admin_key=await _admin_key(settings, eng, state.clock))
            state.manager = None
            state.trigger_target = None
            state.target_lock = asyncio.Lock()
            stack.push_async_callback(_close_trigger_target, state)
            if manager_factory is not None:
                manager = manager_factory(eng)
                await manager.start()
                stack.push_async_callback(manager.stop)
                state.manager = manager
                if settings.probe_dir is not None:
                    await _start_probe(stack, settings, manager)
            yield

    app = FastAPI(
        title="periodic_manager",
        version=periodic_manager.__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served by api.docs from the package's own assets (works offline)
        redoc_url=None,
        dependencies=[Depends(require_scope)],  # the one check of each route's scope
    )
    app.state.pm = AppState(settings, clock if clock is not None else SystemClock())
    install_error_handlers(app)
    # Outermost last: UnsentAnswers (an answer the server refused because it already answered a
    # malformed request) -> NoFraming (every HTML answer, whoever makes it) -> BrowserGuard (Host,
    # cross-site, JSON bodies) -> BodyLimit -> HeadAsGet -> BearerAuth -> routes. The browser
    # checks come before auth: a rebinding page must not even learn whether a token is needed.
    app.add_middleware(BearerAuth, settings=settings, state=app.state.pm)
    app.add_middleware(HeadAsGet)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(BrowserGuard, settings=settings)
    app.add_middleware(NoFraming)
    app.add_middleware(UnsentAnswers)
    for module in ROUTES:
        app.include_router(module.router)
    app.include_router(ui_router())  # the dashboard: /ui, its static files, and / -> /ui
    app.openapi = lambda: _openapi(app, settings)  # type: ignore[method-assign]
    if settings.otel:  # the FastAPI instrumentation, outermost: it sees every answer
        from periodic_manager.tracing import start_tracing

        (tracing or start_tracing()).instrument_app(app)
    return app


async def _admin_key(settings: Settings, engine: Engine, clock: Clock) -> bool:
    """Whether the database holds an active admin key, asked only when the settings alone
    would leave the API open (:func:`~api.auth.exposure`)."""
    return exposure(settings) is not None and await admin_key_in(engine, clock.now())


async def _start_probe(stack: AsyncExitStack, settings: Settings, manager: ManagerHandle) -> None:
    """``run`` with PM_PROBE_DIR: keep ``<dir>/run.json`` fresh from this event loop."""
    from periodic_manager.runtime.probe import ProbeWriter, manager_health

    assert settings.probe_dir is not None
    probe = ProbeWriter(
        settings.probe_dir,
        "run",
        manager_health(manager),
        clock=SystemClock(),
        interval_s=settings.probe_interval,
    )
    probe.write()  # a directory that cannot be written fails the start, loudly
    task = asyncio.create_task(probe.run(), name="periodic-manager-probe")

    async def stop() -> None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        probe.remove()

    stack.push_async_callback(stop)


async def _close_trigger_target(state: AppState) -> None:
    target = state.trigger_target
    if target is not None:
        state.trigger_target = None
        await target.close()


def _openapi(app: FastAPI, settings: Settings) -> dict[str, Any]:
    """FastAPI's document, with every 4xx/5xx declared as a problem (and 401/403 everywhere a
    token may be asked for)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    problem = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(problem.pop("$defs", {}))
    schemas["Problem"] = problem
    content = {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    auth = settings.api_token is not None or settings.api_read_token is not None
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            if path not in OPEN_PATHS:
                responses.setdefault("401", {"description": "Missing or invalid bearer token"})
                responses.setdefault(
                    "403", {"description": "The caller's scope does not allow this"}
                )
            if path not in ANY_HOST_PATHS:
                responses.setdefault("421", {"description": "The Host is not an allowed host"})
            if method.upper() not in SAFE_METHODS:
                responses["403"] = {
                    "description": "A cross-site browser request, or the caller's scope does not allow this"
                }
                responses.setdefault("413", {"description": "The body is larger than the cap"})
                responses.setdefault("415", {"description": "The body is not declared JSON"})
            for code, response in responses.items():
                if code[0] in "45":
                    response["content"] = content
                    response.setdefault("description", HTTPStatus(int(code)).phrase)
                    if code == "422":
                        response["description"] = "Invalid input; `errors` names each field"
            if auth and path not in OPEN_PATHS:
                operation["security"] = [{"bearer": []}]
    if auth:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    app.openapi_schema = schema
    return schema
