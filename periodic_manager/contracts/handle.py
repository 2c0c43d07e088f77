"""The API's view of the manager it runs in its own process: a :class:`ManagerHandle`."""

from __future__ import annotations

from typing import Any, Protocol

from periodic_manager.contracts.targets import Target

__all__ = [
    "ManagerHandle",
]


class ManagerHandle(Protocol):
    """What the API does with the manager it runs in its own process."""

    @property
    def target(self) -> Target:
        """Where manual triggers go."""
        ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def registry(self) -> Any:
        """The Prometheus registry ``/metrics`` serves."""
        ...

    async def start(self) -> None:
        """Start scheduling; awaited before the API serves requests."""
        ...

    async def stop(self) -> None:
        """Stop scheduling; awaited when the API shuts down."""
        ...

    def request_sync(self) -> None:
        """Ask for a sync soon, without waiting for it (called after every successful write)."""
        ...

    def health(self) -> str | None:
        """None while every loop runs; otherwise why the manager is not healthy (one line)."""
        ...

    @property
    def standing_down(self) -> str | None:
        """Why the manager holds no work while its targets do not answer (None: it may)."""
        ...

    def clock_check(self) -> str:
        """Its wall clock against the database's (``/readyz``'s ``clock``): ``ok``, ``skewed:
        ...`` (ready, said) or ``failed: ...`` (not ready: it holds and sends nothing)."""
        ...
