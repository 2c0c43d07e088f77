"""How often a manager does what it does, in seconds: one value its parts share."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Timing:
    """``sync_interval``: a sync at least this often (and at once on a change signal or an API
    edit in the same process); ``full_sync_interval``: a full reconcile at least this often;
    ``grace``: how late a slot may still be sent; ``heartbeat_interval``: how often this manager
    says it is alive (three missed: it is gone from ``/managers``); ``catchup_window``: how far
    back a ``fire_once`` or ``all`` schedule's missed slots are caught up (its
    ``options.catchup_window`` wins); ``catchup_rate``: slots a second a ``misfire: "all"``
    catch-up sends (and a backfill); ``target_ping_interval``: how often a manager that shares
    the work pings its targets, and ``target_ping_failures``: after how many failed pings in a
    row of every target it stands down (:mod:`~periodic_manager.runtime.target_health`)."""

    sync_interval: float = 30.0
    full_sync_interval: float = 300.0
    grace: float = 30.0
    heartbeat_interval: float = 5.0
    catchup_window: float = 3600.0
    catchup_rate: float = 50.0
    target_ping_interval: float = 5.0
    target_ping_failures: int = 2
