"""What the app holds, typed: the settings and the clock ``create_app`` was given, what its lifespan
builds (the engine, the in-process manager, the target of manual triggers) and the dashboard's
caches. Read it with :func:`state_of`; nothing else touches ``app.state``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fastapi import FastAPI

from periodic_manager.contracts import Clock, ManagerHandle, Target
from periodic_manager.db.engine import Engine
from periodic_manager.settings import Settings

from .ui.listing import NextSlots
from .ui.order import NextSlotOrder


@dataclass(eq=False)
class AppState:
    """One per app. ``engine`` is set while the lifespan runs; ``manager`` when the app runs a
    manager in its own process; ``trigger_target`` once a manual trigger needed a target of its
    own (no in-process manager)."""

    settings: Settings
    clock: Clock
    engine: Engine | None = None
    manager: ManagerHandle | None = None
    trigger_target: Target | None = None
    target_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    next_slots: NextSlots = field(default_factory=NextSlots)  # next slot per (spec, zone, anchor)
    order: NextSlotOrder = field(init=False)  # the schedules in next-slot order
    keys_seen: bool = False  # an API key was made: auth is on for good (api/auth.py)

    def __post_init__(self) -> None:
        self.order = NextSlotOrder(self.next_slots)

    @property
    def database(self) -> Engine:
        """The engine; only while the lifespan runs."""
        if self.engine is None:
            raise RuntimeError("the app is not running (its lifespan has not started)")
        return self.engine


def state_of(app: FastAPI) -> AppState:
    state: AppState = app.state.pm
    return state
