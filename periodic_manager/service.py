"""Wiring from Settings: the manager with its provider, target and store (used by the CLI and API)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.clock import Clock
from periodic_manager.db.engine import is_sqlite, normalize_url
from periodic_manager.db.store import DatabaseRuntimeStore
from periodic_manager.leadership import AlwaysLeader, Leadership, PostgresLeadership
from periodic_manager.manager import PeriodicTaskManager
from periodic_manager.providers.database import DatabaseProvider
from periodic_manager.settings import Settings
from periodic_manager.targets.base import Target


def build_target(settings: Settings, engine: AsyncEngine) -> Target:
    """The target ``settings.target`` names."""
    if settings.target == "redis":
        from periodic_manager.targets.redis_streams import RedisStreamsTarget

        return RedisStreamsTarget.from_url(
            settings.redis_url, prefix=settings.stream_prefix, maxlen=settings.redis_maxlen
        )
    from periodic_manager.targets.outbox import OutboxTarget

    return OutboxTarget(engine)


def build_manager(
    settings: Settings, engine: AsyncEngine, *, clock: Clock | None = None, target: Target | None = None
) -> PeriodicTaskManager:
    """A manager reading ``periodic_jobs`` through ``engine``; it closes the target it built on stop."""
    return PeriodicTaskManager(
        DatabaseProvider(engine),
        target or build_target(settings, engine),
        clock=clock,
        sync_interval=settings.sync_interval,
        grace=settings.grace,
        heartbeat_interval=settings.heartbeat_interval,
        store=DatabaseRuntimeStore(
            engine,
            runs_retention=timedelta(days=settings.runs_retention),
            runs_per_schedule=settings.runs_max_per_schedule,
        ),
        close_target=target is None,
        leadership=build_leadership(settings, clock),
        catchup_window=settings.catchup_window,
    )


def build_leadership(settings: Settings, clock: Clock | None = None) -> Leadership:
    """Advisory-lock leader election on PostgreSQL (unless disabled); always leader otherwise."""
    election = settings.leader_election
    if election is None:
        election = not is_sqlite(settings.database_url)
    if not election:
        return AlwaysLeader()
    if is_sqlite(settings.database_url):
        raise ValueError("leader election needs PostgreSQL; run one manager on SQLite")
    return PostgresLeadership(
        normalize_url(settings.database_url),
        clock=clock,
        poll_interval=settings.leader_poll_interval,
        timeout=settings.leader_timeout,
    )
