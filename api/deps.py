"""Request-scoped dependencies: the app's state, a database connection, the request's "now", and
the in-process manager (a :class:`~periodic_manager.contracts.ManagerHandle`) when there is one;
with the parameters the routes share, typed once (``Conn``, ``Now``, ``Limit``, ...)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, NamedTuple

from fastapi import Depends, Query, Request

from periodic_manager.contracts import Clock, Target
from periodic_manager.db.engine import Connection
from periodic_manager.settings import Settings

from .runtime import live_cutoff
from .state import AppState, state_of

log = logging.getLogger(__name__)


def get_state(request: Request) -> AppState:
    return state_of(request.app)


async def get_conn(request: Request) -> AsyncIterator[Connection]:
    """A connection for the request, handed to ``periodic_manager.db``; what the request did not
    commit is rolled back when it ends."""
    async with get_state(request).database.connect() as conn:
        yield conn


def get_settings(request: Request) -> Settings:
    return get_state(request).settings


def get_clock(request: Request) -> Clock:
    return get_state(request).clock


def get_now(request: Request) -> datetime:
    """The request's "now", read once from the app's clock."""
    return get_clock(request).now()


Conn = Annotated[Connection, Depends(get_conn)]
Now = Annotated[datetime, Depends(get_now)]
AppSettings = Annotated[Settings, Depends(get_settings)]


class Paging(NamedTuple):
    """The page of a list a request asks for: ``limit`` items after the first ``offset``."""

    limit: int
    offset: int


def get_paging(
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
) -> Paging:
    return Paging(limit, offset)


Page = Annotated[Paging, Depends(get_paging)]


def get_live_after(now: Now, settings: AppSettings) -> datetime:
    """The heartbeat after which a manager counts as live, for the request's "now"."""
    return live_cutoff(now, settings.heartbeat_interval)


LiveAfter = Annotated[datetime, Depends(get_live_after)]


def notify_manager(request: Request) -> None:
    """Tell the in-process manager (if any) that schedules changed.

    The write has already committed, so a failing signal must not fail the request: the
    manager's periodic sync picks the change up anyway.
    """
    manager = get_state(request).manager
    if manager is None:
        return
    try:
        manager.request_sync()
    except Exception:
        log.exception("request_sync failed; the change is picked up by the next periodic sync")


async def get_target(request: Request) -> Target:
    """Where manual triggers go: the in-process manager's target, else one built from the
    settings on first use (closed at shutdown)."""
    state = get_state(request)
    if state.manager is not None:
        return state.manager.target
    async with state.target_lock:
        if state.trigger_target is None:
            from periodic_manager.runtime.assemble import build_target

            state.trigger_target = build_target(state.settings, state.database)
        return state.trigger_target
