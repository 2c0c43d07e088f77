"""Wiring from Settings: the manager with its provider, target and store (used by the CLI and API)."""

from __future__ import annotations

from dataclasses import fields
from datetime import timedelta
from functools import partial

from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.clock import SystemClock
from periodic_manager.contracts import ChangeSignal, Clock, Leadership, SlotTracer, Target
from periodic_manager.db.changes import peek
from periodic_manager.db.dialects import database_of
from periodic_manager.db.engine import normalize_url
from periodic_manager.db.judge import target_check, task_check
from periodic_manager.db.provider import DatabaseProvider
from periodic_manager.db.schedule_writer import ManagerPauser
from periodic_manager.db.store import DatabaseRuntimeStore
from periodic_manager.errors import ConfigError
from periodic_manager.runtime.leadership import AlwaysLeader, LockLeadership
from periodic_manager.runtime.manager import PeriodicTaskManager, new_manager_id
from periodic_manager.runtime.notify import PostgresChangeListener
from periodic_manager.runtime.partitions import PartitionLeases
from periodic_manager.runtime.poll import RevisionPoller
from periodic_manager.runtime.timing import Timing
from periodic_manager.settings import Settings
from periodic_manager.targets import registry
from periodic_manager.targets.routing import RoutingTarget


def build_target(settings: Settings, engine: AsyncEngine) -> Target:
    """The target ``settings.target`` names, built by its plugin; a RoutingTarget when
    ``settings.targets`` adds more."""
    names = settings.configured_targets()
    # Building opens no connection, so targets built before one that fails need no cleanup.
    built = {}
    for name in names:
        try:
            built[name] = registry.plugin(name).build(settings, engine)
        except ConfigError:
            raise
        except ValueError as exc:  # say which setting holds the value refused
            raise ConfigError(settings.url_setting(name), str(exc)) from None
    if len(built) == 1:
        return built[settings.target]
    return RoutingTarget(built, default=settings.target)


def build_manager(
    settings: Settings,
    engine: AsyncEngine,
    *,
    clock: Clock | None = None,
    target: Target | None = None,
    tracing: SlotTracer | None = None,
) -> PeriodicTaskManager:
    """A manager reading ``periodic_jobs`` through ``engine``; it closes the target it built on stop.

    With ``settings.otel`` its batches are traced through ``tracing`` (default: one started from
    the ``OTEL_*`` variables, shut down when the process exits).

    On PostgreSQL it also LISTENs for the change trigger's notifications (unless ``listen`` is off);
    on MariaDB/MySQL it polls the change revision every ``poll_interval`` instead.
    """
    manager_id = new_manager_id()
    clock = clock or SystemClock()
    targets = settings.configured_targets()
    if settings.otel and tracing is None:
        from periodic_manager.tracing import start_tracing

        tracing = start_tracing()
    return PeriodicTaskManager(
        DatabaseProvider(
            engine,
            check=target_check(targets),
            max_payload_bytes=settings.max_payload_bytes,
            task_check=task_check(targets),
        ),
        target or build_target(settings, engine),
        clock=clock,
        store=DatabaseRuntimeStore(
            engine,
            runs_retention=timedelta(days=settings.runs_retention),
            runs_per_schedule=settings.runs_max_per_schedule,
            changes_retention=timedelta(days=settings.changes_retention),
            changes_per_schedule=settings.changes_max_per_schedule,
        ),
        leadership=build_leadership(settings, clock, manager_id=manager_id),
        signals=change_signals(settings, engine),
        # Every field of Timing is the setting of the same name.
        timing=Timing(**{f.name: getattr(settings, f.name) for f in fields(Timing)}),
        manager_id=manager_id,
        close_target=target is None,
        pauser=ManagerPauser(engine, clock.now),
        metrics_schedules=settings.metrics_schedules,
        tracing=tracing if settings.otel else None,
    )


def change_signals(settings: Settings, engine: AsyncEngine) -> list[ChangeSignal]:
    """What wakes a sync when a row changes: LISTEN on PostgreSQL (unless ``listen`` is off), a
    poll of the revision on MariaDB/MySQL (no LISTEN there); nothing on SQLite (one process: its
    own writes sync at once, plain SQL at the next sync)."""
    url = settings.database_url
    signal = database_of(url).change_signal
    if signal is None or settings.listen is False:
        return []
    if signal == "poll":
        return [RevisionPoller(partial(peek, engine), interval=settings.poll_interval)]
    return [PostgresChangeListener(normalize_url(url))]


def build_leadership(
    settings: Settings, clock: Clock | None = None, *, manager_id: str | None = None
) -> Leadership:
    """Partition leases on PostgreSQL by default (``coordination`` auto or partitions; the holder
    named ``manager_id``); with ``coordination=leader`` (or ``leader_election`` set under auto)
    advisory-lock leader election on PostgreSQL, and named-lock (``GET_LOCK``) election on
    MariaDB/MySQL (unless disabled); always leader otherwise (and on SQLite, where one manager
    holds every schedule)."""
    if settings.coordination_mode == "partitions":
        return PartitionLeases(
            normalize_url(settings.database_url),
            manager_id or new_manager_id(),
            clock=clock,
            ttl=settings.lease_ttl,
        )
    election = settings.leader_election
    if election is None:
        election = database_of(settings.database_url).elects_leader
    if not election:
        return AlwaysLeader()
    return LockLeadership(
        normalize_url(settings.database_url),
        clock=clock,
        poll_interval=settings.leader_poll_interval,
        timeout=settings.leader_timeout,
    )
