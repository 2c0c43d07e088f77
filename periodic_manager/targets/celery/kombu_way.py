"""kombu's way: Celery messages published with ``app.send_task`` (RabbitMQ or another broker, a
topic or fanout exchange, publish signal receivers, ...) under a *pending* claim in Redis.

Each slot first takes a pending claim (:mod:`~periodic_manager.targets.redis.claims`); the
publishing thread (:mod:`~periodic_manager.targets.celery.kombu`) publishes with publisher
confirms (AMQP), and the claim becomes "sent" once the broker confirmed the message. A publish
that failed, timed out or whose reply was lost leaves it pending, and the retry publishes the
slot again with the same task id (reported ``resent``: the workers may see it twice when only
the confirmation was lost; never lost). A publish never started frees its claim.

``options.overlap`` skip and hold: the previous tasks are read from the result backend first,
then a compare-and-set of each schedule's previous-task key takes the pending claim
(:meth:`~periodic_manager.targets.redis.previous.PreviousTasks.claim_pending`); the key is marked
published after the broker confirmed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from periodic_manager.contracts import EnqueueResult, Task
from periodic_manager.errors import TargetError
from periodic_manager.targets.base import overlap_of
from periodic_manager.targets.celery.kombu import KombuPublisher
from periodic_manager.targets.celery.message import celery_message
from periodic_manager.targets.redis.claims import RedisClaims
from periodic_manager.targets.redis.flags import (
    ELSEWHERE,
    NEW,
    RESEND,
    SENT,
    WRONGTYPE,
    wrong_type,
)
from periodic_manager.targets.redis.previous import Decided, PreviousTasks

log = logging.getLogger(__name__)


class KombuWay:
    """Publishes through ``publisher`` under the pending claims of ``claims``."""

    def __init__(
        self, publisher: KombuPublisher, claims: RedisClaims, previous: PreviousTasks | None
    ) -> None:
        self.publisher = publisher
        self.claims = claims
        self.previous = previous  # None: no result backend (overlap tasks are refused earlier)

    async def send(
        self,
        tasks: Sequence[Task],
        indices: list[int],
        results: list[EnqueueResult | None],
        now: datetime,
    ) -> None:
        """Claim, publish and settle the tasks of ``indices``, setting their results. Raises
        TargetError when the broker took only some (the rest keep or free their claims)."""
        # Built at the instant: send_task counts a relative expiry from its own clock.
        messages = {index: celery_message(tasks[index], now) for index in indices}
        publish, resend, decided = await self._claim(tasks, indices, results, now)
        if not publish:
            return
        job = self.publisher.start([messages[index] for index in publish])
        try:
            taken, unknown, error = await self.publisher.wait(job)
        except asyncio.CancelledError:
            # The manager is stopping: publish nothing more, and free the slots not started so
            # that a standby or a restart may send them.
            taken, unknown = self.publisher.stop(job)
            await asyncio.shield(self._settle(tasks, publish, taken, unknown, decided))
            raise
        for index in publish[:taken]:
            status: Literal["enqueued", "resent"] = "resent" if index in resend else "enqueued"
            result = EnqueueResult(tasks[index], status, tasks[index].id)
            if decided is not None and index in decided.written:
                result.previous = decided.previous.get(index)
            results[index] = result
        await self._settle(tasks, publish, taken, unknown, decided)
        if error is None:
            return
        unconfirmed = f" ({unknown} unconfirmed, published again by a retry)" if unknown else ""
        raise TargetError(
            f"celery: published {taken} of {len(publish)} task(s){unconfirmed}: {error}"
        ) from error

    async def _claim(
        self,
        tasks: Sequence[Task],
        indices: list[int],
        results: list[EnqueueResult | None],
        now: datetime,
    ) -> tuple[list[int], set[int], Decided | None]:
        """Take the pending claims: (the tasks to publish, in order; those of them published
        again; the overlap decision, if any task asks for one). Duplicates and busy tasks get
        their result."""
        publish: list[int] = []
        resend: set[int] = set()

        async def claim_plain(ask: list[int]) -> list[int]:
            flags = await self.claims.claim([tasks[i] for i in ask], now)
            for index, flag in zip(ask, flags, strict=True):
                if flag == SENT:
                    results[index] = EnqueueResult(tasks[index], "duplicate", tasks[index].id)
                elif flag == WRONGTYPE:
                    error = wrong_type("celery", self.claims.key(tasks[index].idempotency_key))
                    results[index] = EnqueueResult(tasks[index], "failed", error=error)
                elif flag in (NEW, RESEND):
                    publish.append(index)
                    if flag == RESEND:
                        resend.add(index)
            return [i for i, flag in zip(ask, flags, strict=True) if flag == ELSEWHERE]

        plain = [i for i in indices if overlap_of(tasks[i]) == "allow"]
        await self.claims.until_free(claim_plain, plain, "celery")
        after = [i for i in indices if overlap_of(tasks[i]) != "allow"]
        if not after:
            return publish, resend, None
        assert self.previous is not None
        previous = self.previous
        decided = await previous.read(tasks, after, now, flag="0")

        async def claim_after(ask: list[int]) -> list[int]:
            return await previous.claim_pending(tasks, decided, ask, now)

        await self.claims.until_free(claim_after, decided.free, "celery")
        for index, result in decided.results.items():
            results[index] = result
        return publish + decided.claimed, resend | decided.resend, decided

    async def _settle(
        self,
        tasks: Sequence[Task],
        publish: list[int],
        taken: int,
        unknown: int,
        decided: Decided | None,
    ) -> None:
        """After a publish: the claims of the tasks the broker took become sent, those of tasks
        never started are freed, and one whose outcome is unknown stays pending (a retry
        publishes it again). With overlap, the previous-task keys follow."""
        sent = publish[:taken]
        unsent = publish[taken + unknown :]
        try:
            await self.claims.confirm([tasks[i] for i in sent])
            await self.claims.release([tasks[i] for i in unsent])
        except TargetError as exc:
            # Pending claims are published again by a retry or a takeover (counted resent);
            # none is ever taken for sent.
            log.error("celery: could not settle %d claim(s): %s", len(sent) + len(unsent), exc)
        if decided is None or self.previous is None:
            return
        try:
            await self.previous.published(decided, [i for i in sent if i in decided.written])
            await self.previous.unpublished(decided, [i for i in unsent if i in decided.written])
        except TargetError as exc:
            # Flag 0 keeps a sent task "queued" only for the publish window; a key not put back
            # names a task never sent, which Celery reports PENDING: overlap_timeout frees it.
            log.error("celery: could not update previous-task keys: %s", exc)
