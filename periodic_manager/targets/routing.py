"""Several targets behind one: each task goes to the target its schedule names.

A schedule picks a target with ``options.target`` (``redis``, ``outbox``, ``celery``, ``arq``);
without it the default target gets it. Which targets exist is the deployment's choice
(``PM_TARGET`` and ``PM_TARGETS``): a schedule naming another one is refused by the API (422) and
reported as a row error by the manager (``db.judge.target_check``), never silently dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from periodic_manager.contracts import (
    Clock,
    CountsDeliveries,
    EnqueueResult,
    FailureSignal,
    Forgetful,
    Pingable,
    Prepared,
    Target,
    Task,
    WorksBeside,
    failure_off,
    refused,
)
from periodic_manager.errors import TargetError, TaskRefused
from periodic_manager.targets import completion
from periodic_manager.targets.base import send_prepared, staged


class RoutingTarget:
    """Sends each task to ``targets[task.options.get("target", default)]``.

    A batch is split by target and every target gets its part as one call, all concurrently.
    Results come back in input order. When some targets fail and others do not, the tasks of the
    failed ones are reported ``failed`` (with the error) and the others keep their real outcome;
    when every target involved fails, TargetError is raised (the scheduler then retries the
    batch within grace, and the claims make that safe). A task naming a target that is not
    configured is reported ``failed``.
    """

    name = "routing"

    def __init__(self, targets: Mapping[str, Target], default: str) -> None:
        if default not in targets:
            raise ValueError(f"the default target {default!r} is not among {sorted(targets)}")
        self.targets = dict(targets)
        self.default = default

    def target_name(self, task: Task) -> str:
        return str(task.options.get("target") or self.default)

    def target_for(self, options: Mapping[str, Any]) -> Target | None:
        """The target a schedule with ``options`` goes to (None: not configured here)."""
        return self.targets.get(str(options.get("target") or self.default))

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        """The answer of the target a schedule with ``options`` goes to."""
        if not completion.asks(options):
            return None
        target = self.target_for(options)
        return "its target is not configured" if target is None else target.completion_off(options)

    def failure_off(self, options: Mapping[str, Any]) -> str | None:
        """The answer of the target a schedule with ``options`` goes to."""
        if not completion.fails(options):
            return None
        target = self.target_for(options)
        return "its target is not configured" if target is None else failure_off(target, options)

    async def outcomes(self, options: Mapping[str, Any], task_ids: Sequence[str]) -> list[str]:
        """The outcomes as the schedule's target tells them (TargetError when it cannot)."""
        target = self.target_for(options)
        if not isinstance(target, FailureSignal):
            raise TargetError("the schedule's target cannot tell a failed task")
        return await target.outcomes(options, task_ids)

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        return await self.send(self.prepare(tasks), now)

    def prepare(self, tasks: Sequence[Task]) -> Prepared:
        """Split by target and let each target prepare its part."""
        groups: dict[str, list[int]] = {}
        for index, task in enumerate(tasks):
            groups.setdefault(self.target_name(task), []).append(index)
        parts = []
        for name, indices in groups.items():
            target = self.targets.get(name)
            part = [tasks[i] for i in indices]
            prepared = Prepared(part)
            if target is not None:
                try:
                    prepared = staged(target).prepare(part)
                except Exception:  # noqa: BLE001 - encoded (and its failure reported) when sent
                    pass
            parts.append((name, indices, prepared))
        return Prepared(list(tasks), parts)

    async def send(self, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
        tasks = prepared.tasks
        if not tasks:
            return []
        results: list[EnqueueResult | None] = [None] * len(tasks)
        parts: list[tuple[str, list[int], Prepared]] = []
        for name, indices, part in prepared.data:
            if name in self.targets:
                parts.append((name, indices, part))
                continue
            for index in indices:  # no retry configures it: refused for good
                results[index] = refused(tasks[index], f"target {name!r} is not configured")
        outcomes = await asyncio.gather(
            *(send_prepared(self.targets[name], part, now) for name, _, part in parts),
            return_exceptions=True,
        )
        failures: list[tuple[str, Exception]] = []
        for (name, indices, _), outcome in zip(parts, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome  # cancellation and friends are not a target's failure
                failures.append((name, outcome))
                # A group refused for good (TaskRefused) stays refused; any other failure of a
                # group's target (its broker down) may pass: retried.
                permanent = isinstance(outcome, TaskRefused)
                for index in indices:
                    results[index] = EnqueueResult(
                        tasks[index], "failed", error=f"{name}: {outcome}", permanent=permanent
                    )
                continue
            if len(outcome) != len(indices):
                raise TargetError(
                    f"target {name!r} returned {len(outcome)} results for {len(indices)} tasks"
                )
            for index, result in zip(indices, outcome, strict=True):
                results[index] = result
        # Every target failed: one error for the call, unless some tasks were refused for good
        # (their results say so; the rest are retried alone).
        if (
            failures
            and len(failures) == len(parts)
            and not any(r is not None and r.permanent for r in results)
        ):
            message = "; ".join(f"{name}: {exc}" for name, exc in failures)
            raise TargetError(message) from failures[0][1]
        return [r for r in results if r is not None]

    async def ping(self) -> None:
        """Raise unless every target answers; the error names each one that does not. A target
        that cannot be pinged counts as reachable."""
        pingable = {n: t for n, t in self.targets.items() if isinstance(t, Pingable)}
        outcomes = await asyncio.gather(
            *(t.ping() for t in pingable.values()), return_exceptions=True
        )
        failures = []
        for name, outcome in zip(pingable, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome
                failures.append(f"{name}: {type(outcome).__name__}: {outcome}")
        if failures:
            raise TargetError("; ".join(failures))

    async def forgotten(self) -> list[str]:
        """The targets whose broker lost its data since the previous call. Each is asked
        alone: one that cannot be asked now (its broker is down: readiness says so) is asked
        again next time and does not hide the others."""
        lost: list[str] = []
        for target in self.targets.values():
            if isinstance(target, Forgetful):
                with contextlib.suppress(TargetError):
                    lost += await target.forgotten()
        return lost

    def delivery_counts(self) -> dict[str, int]:
        """The deliveries of every target that counts some, added up."""
        total: dict[str, int] = {}
        for target in self.targets.values():
            if isinstance(target, CountsDeliveries):
                for outcome, n in target.delivery_counts().items():
                    total[outcome] = total.get(outcome, 0) + n
        return total

    async def run_beside(self, clock: Clock, owner: str) -> None:
        """The work beside the manager of every target that has some (none: wait for the
        cancellation); the first to end ends it, as the manager's supervision expects."""
        works = [
            asyncio.ensure_future(t.run_beside(clock, owner))
            for t in self.targets.values()
            if isinstance(t, WorksBeside)
        ]
        if not works:
            await asyncio.get_running_loop().create_future()
        try:
            done, _ = await asyncio.wait(works, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            for task in works:
                task.cancel()
            await asyncio.gather(*works, return_exceptions=True)

    async def close(self) -> None:
        """Close every target (all of them, even if one fails; the first error is raised)."""
        outcomes = await asyncio.gather(
            *(t.close() for t in self.targets.values()), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
