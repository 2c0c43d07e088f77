"""Publishing under a *pending* claim in Redis, for messages that do not live in that Redis step
for step with their claim: Celery through kombu (RabbitMQ or another broker, a topic or fanout
exchange, publish signal receivers, ...) and Dramatiq on RabbitMQ.

Each slot first takes a pending claim (:mod:`~periodic_manager.targets.redis.claims`); the
publishing thread (:mod:`~periodic_manager.targets.publisher`) publishes with publisher confirms
(AMQP), and the claim becomes "sent" once the broker confirmed the message. A publish that failed,
timed out or whose reply was lost leaves it pending, and the retry publishes the slot again with
the same task id (reported ``resent``: the workers may see it twice when only the confirmation was
lost; never lost). A publish never started frees its claim: nothing is read after the claims are
taken, and a failure between them and the publish frees the claims this call took (a claim taken
again to publish again stays pending: it was maybe published).

``options.overlap`` skip and hold (where the target can tell that a task finished: ``previous``):
the previous tasks are read first, then the same script call that takes the pending claims
compares each schedule's previous-task key with what was read and records the new task (flag 0);
the key is marked published after the broker confirmed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from periodic_manager.contracts import QUEUED, EnqueueResult, Previous, Task, refused
from periodic_manager.errors import TargetError, cause
from periodic_manager.targets.base import overlap_of
from periodic_manager.targets.publisher import ThreadPublisher
from periodic_manager.targets.redis.claims import RedisClaims
from periodic_manager.targets.redis.flags import BUSY, ELSEWHERE, NEW, RESEND, SENT, wrong_type
from periodic_manager.targets.redis.previous import Decided, PreviousTasks

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Call:
    """One :meth:`PendingPublisher.send`: its tasks, their results (set as they are known), its
    instant, the options.overlap decision read first and the messages built at that instant."""

    tasks: Sequence[Task]
    results: list[EnqueueResult | None]
    now: datetime
    decided: Decided | None = None
    messages: dict[int, Any] = field(default_factory=dict)


class PendingWay:
    """Publishes through ``publisher`` under the pending claims of ``claims``: ``build`` makes a
    task's message at the instant (what ``publisher``'s outlet publishes); ``name`` (the target's)
    starts every error text."""

    def __init__(
        self,
        name: str,
        publisher: ThreadPublisher,
        claims: RedisClaims,
        previous: PreviousTasks | None,
        build: Callable[[Task, datetime], Any],
    ) -> None:
        self.name = name
        self.publisher = publisher
        self.claims = claims
        self.previous = previous  # None: cannot tell (overlap tasks are refused earlier)
        self.build = build

    async def send(
        self,
        tasks: Sequence[Task],
        indices: list[int],
        results: list[EnqueueResult | None],
        now: datetime,
    ) -> None:
        """Claim, publish and settle the tasks of ``indices``, setting their results. Raises
        TargetError when the broker took only some (the rest keep or free their claims), or when
        a read or a claim failed before anything was published (then no claim of this call is
        left taken, except those it could not free: a retry publishes them as resent).

        What is claimed is published at once; slots another publisher holds pending are asked
        for again meanwhile, each published once free, and reported failed if still held after
        :meth:`~periodic_manager.targets.redis.claims.RedisClaims.until_free`'s wait."""
        call = _Call(tasks, results, now)
        # Built at the instant (Celery's send_task counts a relative expiry from its own clock).
        call.messages = {index: self.build(tasks[index], now) for index in indices}
        # options.overlap: the previous tasks are read first (the result backend may fail), so
        # that nothing is claimed before a read that fails.
        call.decided = await self._read(call, indices)

        async def claim_and_publish(ask: list[int]) -> list[int]:
            return await self._round(call, ask)

        free = [i for i in indices if results[i] is None]
        for index in await self.claims.until_free(claim_and_publish, free):
            results[index] = EnqueueResult(
                tasks[index], "failed", error=self.claims.held_error(self.name)
            )

    async def _round(self, call: _Call, indices: list[int]) -> list[int]:
        """Claim the tasks of ``indices``, publish those claimed and settle them; returns those
        another publisher holds pending (ask again). Raises as :meth:`send`."""
        publish: list[int] = []  # claimed, in order
        resend: set[int] = set()  # of those: pending claims taken again (published again)
        tasks, results, decided = call.tasks, call.results, call.decided
        try:
            held = await self._claim(call, indices, publish, resend)
            if not publish:
                return held
            job = self.publisher.start([call.messages[index] for index in publish])
        except BaseException:
            # Nothing of this round was published: free the claims it took.
            await asyncio.shield(self._unclaim(call, publish, resend))
            raise
        try:
            taken, unknown, error = await self.publisher.wait(job)
        except asyncio.CancelledError:
            # The manager is stopping: publish nothing more, and free the slots not started so
            # that a standby or a restart may send them.
            taken, unknown = self.publisher.stop(job)
            await asyncio.shield(self._settle(call, publish, taken, unknown))
            raise
        for index in publish[:taken]:
            status: Literal["enqueued", "resent"] = "resent" if index in resend else "enqueued"
            result = EnqueueResult(tasks[index], status, tasks[index].id)
            if decided is not None and index in decided.written:
                result.previous = decided.previous.get(index)
            results[index] = result
        await self._settle(call, publish, taken, unknown)
        if error is None:
            return held
        unconfirmed = f" ({unknown} unconfirmed, published again by a retry)" if unknown else ""
        raise TargetError(
            f"{self.name}: published {taken} of {len(publish)} task(s){unconfirmed}: {error}"
        ) from error

    async def _read(self, call: _Call, indices: list[int]) -> Decided | None:
        """options.overlap: the decision of the tasks of ``indices`` that ask for one (None if
        none does); those not to send (duplicate, busy) get their result. Writes nothing."""
        tasks = call.tasks
        after = [i for i in indices if overlap_of(tasks[i]) != "allow"]
        if not after:
            return None
        assert self.previous is not None
        decided = await self.previous.read(tasks, after, call.now, flag="0")
        for index, result in decided.results.items():
            call.results[index] = result
        return decided

    async def _claim(
        self, call: _Call, indices: list[int], publish: list[int], resend: set[int]
    ) -> list[int]:
        """Take the pending claims of the tasks of ``indices`` in one call (with the
        compare-and-set of their previous-task keys, for those ``decided`` holds): the claimed
        ones join ``publish`` (and ``resend``), duplicates, busy tasks and keys of another type
        get their result. Returns those another publisher holds pending (ask again)."""
        tasks, results = call.tasks, call.results
        written = call.decided.written if call.decided is not None else {}
        prevs = [written.get(i) for i in indices]
        flags = await self.claims.claim([tasks[i] for i in indices], call.now, prevs)
        held = []
        for index, flag in zip(indices, flags, strict=True):
            task = tasks[index]
            if flag in (NEW, RESEND):
                publish.append(index)
                if flag == RESEND:
                    resend.add(index)
                continue
            if flag == ELSEWHERE:
                held.append(index)
                continue
            prev = written.pop(index, None)
            if flag == SENT:
                results[index] = EnqueueResult(task, "duplicate", task.id)
            elif flag == BUSY:  # another manager sent a task of this schedule since it was read
                results[index] = EnqueueResult(task, "busy", previous=Previous(None, QUEUED))
            else:
                keys = [self.claims.key(task.idempotency_key), *([prev[0]] if prev else [])]
                results[index] = refused(task, wrong_type(self.name, *keys))
        return held

    async def _unclaim(self, call: _Call, publish: list[int], resend: set[int]) -> None:
        """Free the claims this call took for tasks it never published, and put back their
        previous-task keys. A claim taken again to publish again stays pending: it was maybe
        published before (a retry publishes it, as resent)."""
        new = [i for i in publish if i not in resend]
        tasks, decided = call.tasks, call.decided
        try:
            await self.claims.release([tasks[i] for i in new])
            if decided is not None and self.previous is not None:
                await self.previous.unpublished(decided, [i for i in new if i in decided.written])
        except TargetError as exc:
            # Left pending: a retry or a takeover publishes them, counted resent; none is lost.
            log.error(
                "%s: could not free %d claim(s) of unpublished tasks: %s", self.name, len(new), exc
            )

    async def _settle(self, call: _Call, publish: list[int], taken: int, unknown: int) -> None:
        """After a publish: the claims of the tasks the broker took become sent, those of tasks
        never started are freed, and one whose outcome is unknown stays pending (a retry
        publishes it again). With overlap, the previous-task keys follow."""
        sent = publish[:taken]
        unsent = publish[taken + unknown :]
        tasks, decided = call.tasks, call.decided
        try:
            await self.claims.confirm([tasks[i] for i in sent])
            await self.claims.release([tasks[i] for i in unsent])
        except TargetError as exc:
            # Pending claims are published again by a retry or a takeover (counted resent);
            # none is ever taken for sent.
            log.error(
                "%s: could not settle %d claim(s): %s", self.name, len(sent) + len(unsent), exc
            )
        if decided is None or self.previous is None:
            return
        try:
            await self.previous.published(decided, [i for i in sent if i in decided.written])
            await self.previous.unpublished(decided, [i for i in unsent if i in decided.written])
        except TargetError as exc:
            # Flag 0 keeps a sent task "queued" only for the publish window; a key not put back
            # names a task never sent, which Celery reports PENDING: overlap_timeout frees it.
            log.error("%s: could not update previous-task keys: %s", self.name, cause(exc))
