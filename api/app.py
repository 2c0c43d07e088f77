"""The application factory. Nothing is built at import time: engine, clock and manager come from
``create_app``'s arguments or are made in the lifespan, which also owns an in-process manager."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

import periodic_manager
from api.deps import ManagerLike
from api.errors import install_error_handlers
from api.routes import entries, health, schedules
from periodic_manager.clock import Clock, SystemClock
from periodic_manager.db.engine import create_engine, sessionmaker
from periodic_manager.settings import Settings


def create_app(
    settings: Settings,
    *,
    clock: Clock | None = None,
    engine: AsyncEngine | None = None,
    manager_factory: Callable[[AsyncEngine], ManagerLike] | None = None,
) -> FastAPI:
    """Build the API.

    ``engine``: use this engine (the caller disposes it); otherwise one is made from
    ``settings.database_url`` at startup and disposed at shutdown. ``manager_factory``: build an
    in-process manager from the engine; it is started before serving, stopped at shutdown and
    asked to sync after every successful write.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            eng = engine
            if eng is None:
                eng = create_engine(settings.database_url)
                stack.push_async_callback(eng.dispose)
            app.state.engine = eng
            app.state.sessionmaker = sessionmaker(eng)
            app.state.manager = None
            if manager_factory is not None:
                manager = manager_factory(eng)
                await manager.start()
                stack.push_async_callback(manager.stop)
                app.state.manager = manager
            yield

    app = FastAPI(
        title="periodic_manager",
        version=periodic_manager.__version__,
        description="Edit periodic schedules (rows of `periodic_jobs`) and inspect what running managers registered.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.clock = clock if clock is not None else SystemClock()
    install_error_handlers(app)
    app.include_router(schedules.router)
    app.include_router(entries.router)
    app.include_router(health.router)
    return app
