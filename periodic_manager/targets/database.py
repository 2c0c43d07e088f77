"""What the targets that write into a database (the outbox, procrastinate, http) share: their
engine (the manager's, or one of their own from a URL), one transaction per batch (``prepare``
the rows, then ``send`` them), whether they write into the manager's own database, the close,
and how a batch's rows become its results (:func:`batch_results`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Self

from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.contracts import EnqueueResult, Prepared, Task, refused
from periodic_manager.db.engine import create_engine
from periodic_manager.errors import TargetError


class DatabaseTarget:
    """The shared part of a target in a database (see the module doc)."""

    _engine: AsyncEngine
    _owns_engine = False

    def __init__(self, engine: AsyncEngine) -> None:
        """A target takes the engine it writes through (TargetError: a database it cannot use)."""
        raise NotImplementedError

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Self:
        """A target with its own engine (disposed by :meth:`close`)."""
        engine = create_engine(url, **kwargs)
        try:
            target = cls(engine)
        except TargetError:
            engine.sync_engine.dispose()
            raise
        target._owns_engine = True
        return target

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        """Insert the batch in one transaction; report each task in input order."""
        return await self.send(self.prepare(tasks), now)

    def prepare(self, tasks: Sequence[Task]) -> Prepared:
        raise NotImplementedError

    async def send(self, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
        raise NotImplementedError

    @property
    def in_manager_database(self) -> bool:
        """Whether this target writes through an engine it was given (the manager's own)."""
        return not self._owns_engine

    async def close(self) -> None:
        """Dispose of the engine if this target created it (:meth:`from_url`)."""
        if self._owns_engine:
            await self._engine.dispose()


def batch_results(
    tasks: Sequence[Task],
    refusals: Mapping[int, str],
    decided: Mapping[int, EnqueueResult],
    inserted: Mapping[str, object],
    existing: Mapping[str, object],
) -> list[EnqueueResult]:
    """The results of a batch written into a database, in input order: the tasks refused
    (``refusals``: why), those decided alone (``decided``: options.overlap), then each key
    ``inserted`` now (its row's id: enqueued, once; a key repeated within the batch is new once,
    then a duplicate of that row) or found there already (``existing``: duplicate)."""
    ids = dict(existing)
    new = dict(inserted)
    results = []
    for index, task in enumerate(tasks):
        if index in refusals:
            results.append(refused(task, refusals[index]))
        elif index in decided:
            results.append(decided[index])
        elif (row := new.pop(task.idempotency_key, None)) is not None:
            ids[task.idempotency_key] = row
            results.append(EnqueueResult(task, "enqueued", str(row)))
        else:
            found = ids.get(task.idempotency_key)
            results.append(EnqueueResult(task, "duplicate", None if found is None else str(found)))
    return results
