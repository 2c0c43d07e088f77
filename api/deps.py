"""Request-scoped dependencies and the small protocol the API needs from an in-process manager."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Protocol

from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncSession

from periodic_manager.contracts import Clock, Target
from periodic_manager.settings import Settings

log = logging.getLogger(__name__)


class ManagerLike(Protocol):
    """What the API's lifespan does with an in-process manager."""

    async def start(self) -> None:
        """Start scheduling; awaited before the API serves requests."""
        ...

    async def stop(self) -> None:
        """Stop scheduling; awaited when the API shuts down."""
        ...

    def request_sync(self) -> None:
        """Ask for a sync soon, without waiting for it (called after every successful write)."""
        ...

    # Optional, read with getattr: ``target`` (used by manual triggers), ``metrics`` (served by
    # /metrics), ``is_leader`` and ``failed`` (reported by /readyz).


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessionmaker() as session:
        yield session


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_clock(request: Request) -> Clock:
    clock: Clock = request.app.state.clock
    return clock


def get_now(request: Request) -> datetime:
    """The request's "now", read once from the app's clock."""
    return get_clock(request).now()


def notify_manager(request: Request) -> None:
    """Tell the in-process manager (if any) that schedules changed.

    The write has already committed, so a failing signal must not fail the request: the
    manager's periodic sync picks the change up anyway.
    """
    manager: ManagerLike | None = getattr(request.app.state, "manager", None)
    if manager is None:
        return
    try:
        manager.request_sync()
    except Exception:
        log.exception("request_sync failed; the change is picked up by the next periodic sync")


async def get_target(request: Request) -> Target:
    """Where manual triggers go: the in-process manager's target, else one built from the
    settings on first use (closed at shutdown)."""
    state = request.app.state
    manager = getattr(state, "manager", None)
    target: Target | None = getattr(manager, "target", None)
    if target is not None:
        return target
    async with state.target_lock:
        if state.trigger_target is None:
            from periodic_manager.runtime.assemble import build_target

            state.trigger_target = build_target(state.settings, state.engine)
        built: Target = state.trigger_target
        return built
