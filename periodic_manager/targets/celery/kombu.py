"""kombu's way out for Celery: ``app.send_task`` on a producer of the app's pool, as the
:class:`~periodic_manager.targets.publisher.Outlet` of the publishing thread (for the brokers and
routes the Redis writer does not handle)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class CeleryOutlet:
    """Publishes ``send_task`` keyword-argument dicts (``celery_message``) with ``app``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    @contextmanager
    def session(self) -> Iterator[Callable[[dict[str, Any]], None]]:
        with self.app.producer_or_acquire() as producer:

            def publish(msg: dict[str, Any]) -> None:
                self.app.send_task(producer=producer, **msg)

            yield publish

    def close(self) -> None:
        self.app.close()
