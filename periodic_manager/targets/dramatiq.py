"""Dramatiq target: each slot becomes a Dramatiq message, as Dramatiq's own broker writes it, on
Redis or RabbitMQ.

Needs the ``dramatiq`` extra (``pip install 'periodic-manager[dramatiq]'``); dramatiq is imported
only when a target is built, so the core runs without it.

- ``task_type`` -> the actor name (``actor_name``);
- payload -> the actor's arguments, the one rule of every target that calls a function
  (:func:`~periodic_manager.targets.base.split_payload`): a JSON object becomes keyword
  arguments, an array positional arguments, ``null`` none, any other value one positional argument;
- the message id (``message_id``) = the task id, the uuid5 of the idempotency key (the same on
  every manager); ``message_timestamp``: when it was enqueued;
- ``options.queue`` -> the Dramatiq queue (``default`` without it);
- the message's options: ``scheduled_at`` (UTC ISO text), ``idempotency_key`` and, with
  ``PM_OTEL``, ``traceparent`` (the W3C trace context a worker continues).

The message is dramatiq's own :class:`dramatiq.Message`, encoded by its encoder (the JSON one a
plain ``dramatiq`` worker reads; a worker with another global encoder cannot read it).

**Redis** (``redis://``, ``rediss://``): Dramatiq's RedisBroker stores the encoded message in the
hash ``<namespace>:<queue>.msgs`` under its ``redis_message_id`` (here the task id, an option of
the message as the broker sets it) and pushes that id on the list ``<namespace>:<queue>``. One
script claims the slot (``<prefix>:claim:<key>``) and does both, or finds the slot claimed or the
message still queued: claim and message are one step, whatever replies are lost or managers race.

**RabbitMQ** (``amqp://``, ``amqps://``): published on dramatiq's own RabbitmqBroker's channel (it
declares the queue with the arguments its workers declare it with; :class:`RabbitOutlet`) with
publisher confirms, under a pending claim in the manager's Redis that the confirmation turns
into sent (:mod:`~periodic_manager.targets.redis.pending`, Celery's way through kombu): a message
whose confirmation was lost is published again with the same message id, reported ``resent``.

``options.overlap`` skip and hold are refused: Dramatiq deletes a message once a worker
acknowledges it and keeps no outcome without its Results middleware
(:data:`~periodic_manager.targets.builtin.dramatiq.DRAMATIQ_NO_RESULTS`).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from periodic_manager.contracts import EnqueueResult, Task, refused
from periodic_manager.errors import TargetError
from periodic_manager.plugins.task_rules import TaskProblem
from periodic_manager.schedules.instants import slot_text
from periodic_manager.targets import completion
from periodic_manager.targets.base import overlap_refusals, split_payload
from periodic_manager.targets.builtin.dramatiq import (
    AMQP_SCHEMES,
    DRAMATIQ,
    DRAMATIQ_NO_RESULTS,
    check_url,
)
from periodic_manager.targets.publisher import ThreadPublisher
from periodic_manager.targets.redis import lua
from periodic_manager.targets.redis.claims import RedisClaims
from periodic_manager.targets.redis.job_target import bounded_pool
from periodic_manager.targets.redis.jobs import JobBatch
from periodic_manager.targets.redis.pending import PendingWay
from periodic_manager.targets.redis.previous import Decided
from periodic_manager.targets.redis.sentinel import Sentinel
from periodic_manager.tracing import trace_headers

# Claims each message's slot and enqueues it (its arguments and flags are written at its top).
CLAIM_AND_ENQUEUE = lua.script("periodic_manager.targets", "dramatiq_claim_and_enqueue.lua")
CHUNK = 500  # messages per script call
DEFAULT_QUEUE = "default"
# Dramatiq's rule for a queue name (an actor refuses any other); .DQ and .XQ name its delay and
# dead-letter queues.
_QUEUE_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9._-]*")


def _import_dramatiq() -> Any:
    return DRAMATIQ.load()


def dramatiq_queue(task: Task) -> str:
    """The task's Dramatiq queue (ValueError if Dramatiq would refuse its name)."""
    queue = task.options.get("queue") or DEFAULT_QUEUE
    if not isinstance(queue, str) or not _QUEUE_NAME.fullmatch(queue):
        raise ValueError(f"options.queue {queue!r} is not a Dramatiq queue name")
    if queue.endswith((".DQ", ".XQ")):
        raise ValueError(f"options.queue {queue!r} names a delay or dead-letter queue")
    return queue


def dramatiq_message(task: Task, now: datetime, **options: Any) -> Any:
    """The :class:`dramatiq.Message` of ``task`` enqueued at ``now`` (``options``: the broker's
    own, added to the manager's); ValueError if the task cannot be one."""
    from dramatiq import Message

    if not task.task_type:
        raise ValueError("task_type (the actor name) is empty")
    args, kwargs = split_payload(task.payload)
    return Message(
        queue_name=dramatiq_queue(task),
        actor_name=task.task_type,
        args=tuple(args),
        kwargs=kwargs,
        options={
            "scheduled_at": slot_text(task.scheduled_at),
            "idempotency_key": task.idempotency_key,
            **trace_headers(task),
            **options,
        },
        message_id=task.id,
        message_timestamp=int(now.astimezone(UTC).timestamp() * 1000),
    )


def encoded(message: Any) -> bytes:
    """``message`` as Dramatiq's broker stores it (ValueError if its encoder cannot)."""
    try:
        return bytes(message.encode())
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cannot encode the message: {exc}") from None


@dataclass(frozen=True, slots=True)
class RedisMessage:
    """One message as Dramatiq's RedisBroker enqueues it."""

    queue: str
    data: bytes


class RabbitOutlet:
    """Publishes :class:`dramatiq.Message` objects to RabbitMQ, confirmed (the
    :class:`~periodic_manager.targets.publisher.Outlet` of the publishing thread).

    The connection, its confirm-mode channel and the queues' declarations (the queue, its ``.DQ``
    and ``.XQ`` queues, with the arguments Dramatiq's workers declare them with) are dramatiq's
    own RabbitmqBroker's, with no middleware: nothing of the user's runs in the manager. The
    publish is the one ``RabbitmqBroker.enqueue`` makes (default exchange, routing key the queue,
    persistent, ``broker_priority`` as priority, mandatory), made once: ``enqueue`` would publish
    again by itself after a failure, uncounted, where a re-publish must be the pending claims'
    (reported ``resent``).
    """

    def __init__(self, url: str) -> None:
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        self.broker = RabbitmqBroker(url=url, confirm_delivery=True, middleware=[])

    @contextmanager
    def session(self) -> Iterator[Callable[[Any], None]]:
        import pika  # type: ignore[import-untyped]
        import pika.exceptions  # type: ignore[import-untyped]

        broker = self.broker
        failures = (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError)
        # Connect first (the broker connects lazily): a broker that cannot be reached fails the
        # session, before any publish, so that no slot is left unknown.
        try:
            channel = broker.channel
        except failures:
            del broker.connection  # the next session connects afresh
            raise

        def publish(message: Any) -> None:
            try:
                broker.declare_queue(message.queue_name, ensure=True)
                channel.basic_publish(
                    exchange="",
                    routing_key=message.queue_name,
                    body=message.encode(),
                    properties=pika.BasicProperties(
                        delivery_mode=2, priority=message.options.get("broker_priority")
                    ),
                    mandatory=True,
                )  # returns once RabbitMQ confirmed it
            except failures as exc:
                del broker.connection  # the next session connects afresh
                if isinstance(exc, pika.exceptions.UnroutableError):
                    broker.queues_pending.add(message.queue_name)  # deleted: declared again
                raise

        yield publish

    def close(self) -> None:
        self.broker.close()

    def connect(self) -> None:
        """Open and close a connection (a readiness check)."""
        import pika

        pika.BlockingConnection(self.broker.parameters).close()


class DramatiqTarget:
    """Enqueues tasks as Dramatiq messages, once per idempotency key (see the module docstring).

    ``claims``: where slots are claimed; on Redis, a client of Dramatiq's Redis (messages and
    claims are written together). ``namespace``: the RedisBroker's ``namespace`` (``dramatiq``
    by default); the workers must use the same. ``rabbit``: with it, messages go to RabbitMQ.
    """

    name = "dramatiq"

    def __init__(
        self,
        claims: RedisClaims,
        *,
        namespace: str = "dramatiq",
        rabbit: RabbitOutlet | None = None,
        timeout: float = 5.0,
        concurrency: int = 8,
    ) -> None:
        if timeout <= 0 or concurrency < 1:
            raise ValueError("timeout must be > 0 and concurrency >= 1")
        _import_dramatiq()
        self.claims = claims
        self.namespace = namespace
        self.rabbit = rabbit
        self.timeout = timeout
        self.concurrency = concurrency
        self.sentinel = Sentinel(claims.client, f"{claims.prefix}:sentinel", timeout=timeout)
        self._script = claims.client.register_script(CLAIM_AND_ENQUEUE)
        self._publisher: ThreadPublisher | None = None
        self._pending: PendingWay | None = None
        if rabbit is not None:
            self._publisher = ThreadPublisher(rabbit, timeout, "pm-dramatiq-publish")
            self._pending = PendingWay(
                self.name, self._publisher, claims, None, self._rabbit_message
            )
        self._owns_client = False

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        claims_url: str | None = None,
        prefix: str = "pm",
        namespace: str = "dramatiq",
        claim_margin: float = 60.0,
        timeout: float = 5.0,
        concurrency: int = 8,
    ) -> DramatiqTarget:
        """A target on Dramatiq's broker ``url`` with its own clients (closed by :meth:`close`);
        no I/O until used. Claims live in Dramatiq's Redis, or in ``claims_url`` (a Redis URL)
        when the broker is RabbitMQ."""
        check_url(url)
        _import_dramatiq()
        import redis.asyncio as aioredis

        rabbit, redis_url = None, url
        if url.startswith(AMQP_SCHEMES):
            if claims_url is None:
                raise ValueError("a RabbitMQ broker needs claims_url (a Redis URL for the claims)")
            rabbit, redis_url = RabbitOutlet(url), claims_url
        pool = bounded_pool(redis_url, timeout=timeout, concurrency=concurrency)
        client = aioredis.Redis(connection_pool=pool)
        # A pending claim of another publisher is abandoned once older than any publish of it
        # can take (one timeout per operation, a second one to learn its outcome).
        claims = RedisClaims(client, prefix=prefix, margin=claim_margin, stale_s=3 * timeout + 1)
        target = cls(
            claims, namespace=namespace, rabbit=rabbit, timeout=timeout, concurrency=concurrency
        )
        target._owns_client = True
        return target

    def _redis_message(self, task: Task, now: datetime) -> RedisMessage:
        message = dramatiq_message(task, now, redis_message_id=task.id)
        return RedisMessage(message.queue_name, encoded(message))

    def _rabbit_message(self, task: Task, now: datetime) -> Any:
        message = dramatiq_message(task, now)
        encoded(message)  # refused here, not in the publishing thread
        return message

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        """Claim and enqueue every task's message; report each task in input order. A task that
        cannot be a message (or asks for options.overlap) fails alone. Raises TargetError when
        Redis or RabbitMQ fails (see the module docstring for what a retry finds)."""
        results, send = overlap_refusals(self, tasks)
        part = [tasks[i] for i in send]
        if self._pending is not None:
            sent: list[EnqueueResult | None] = [None] * len(part)
            built: list[int] = []
            for index, task in enumerate(part):
                try:
                    self._rabbit_message(task, now)
                    built.append(index)
                except (TypeError, ValueError) as exc:
                    sent[index] = refused(task, f"{self.name}: {exc}")
            await self._pending.send(part, built, sent, now)
            done = [r for r in sent if r is not None]
        else:
            batch = JobBatch(
                self.name,
                self._redis_message,
                self._call,
                None,
                self.timeout,
                self.concurrency,
                CHUNK,
            )
            done = await batch.enqueue(part, now)
        for index, result in zip(send, done, strict=True):
            results[index] = result
        return [r for r in results if r is not None]

    async def _call(
        self,
        queue: str,
        part: list[int],
        tasks: Sequence[Task],
        messages: dict[int, RedisMessage],
        decided: Decided | None,
        now: datetime,
    ) -> list[Any]:
        """One script call for the messages ``part`` of ``queue``: a flag per message."""
        rows = [
            [tasks[i].idempotency_key, tasks[i].id, self.claims.ttl_ms(tasks[i], now)] for i in part
        ]
        keys = [f"{self.namespace}:{queue}", f"{self.namespace}:{queue}.msgs"]
        args: list[str | bytes] = [self.claims.key(""), json.dumps(rows)]
        args += [messages[i].data for i in part]
        return list(await self._script(keys=keys, args=args))

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        """Dramatiq cannot tell that a message finished (see the module docstring)."""
        return DRAMATIQ_NO_RESULTS if completion.asks(options) else None

    async def ping(self) -> None:
        """Raise unless the claims' Redis (Dramatiq's own, on Redis) and RabbitMQ, if that is the
        broker, answer, each within ``timeout`` (a readiness check; RabbitMQ in a thread)."""
        async with asyncio.timeout(self.timeout):
            await self.claims.ping()
        if self.rabbit is None:
            return
        try:
            async with asyncio.timeout(self.timeout):
                await asyncio.to_thread(self.rabbit.connect)
        except TimeoutError:
            raise TargetError(f"dramatiq: rabbitmq: no answer within {self.timeout:g} s") from None
        except Exception as exc:  # noqa: BLE001 - pika raises many types
            raise TargetError(f"dramatiq: rabbitmq: {type(exc).__name__}: {exc}") from exc

    async def forgotten(self) -> list[str]:
        """``["dramatiq"]`` when the claims' Redis lost its data since the previous call."""
        return [self.name] if await self.sentinel.lost() else []

    async def close(self) -> None:
        """Stop the publishing thread and close RabbitMQ's connections; close the Redis client if
        this target created it (:meth:`from_url`)."""
        if self._publisher is not None:
            closing = asyncio.wrap_future(self._publisher.close_outlet())
            await asyncio.wait({closing}, timeout=self.timeout)  # behind a stuck publish: bounded
            self._publisher.shutdown()
        if self._owns_client:
            await self.claims.client.aclose()
            await self.claims.client.connection_pool.disconnect()


def task_problem(
    task_type: str, payload_json: str, options: Mapping[str, Any]
) -> TaskProblem | None:
    """What Dramatiq refuses whenever the task is sent
    (:mod:`~periodic_manager.plugins.task_rules`): an ``options.queue`` that is no Dramatiq
    queue name, or names a delay or dead-letter queue, as :func:`dramatiq_queue` refuses it."""
    queue = options.get("queue") or DEFAULT_QUEUE
    if not isinstance(queue, str) or not _QUEUE_NAME.fullmatch(queue):
        return TaskProblem(
            "options.queue",
            f"{queue!r} is not a Dramatiq queue name (a letter or '_', then letters, digits, "
            "'.', '_' or '-')",
        )
    if queue.endswith((".DQ", ".XQ")):
        return TaskProblem(
            "options.queue", f"{queue!r} names a Dramatiq delay (.DQ) or dead-letter (.XQ) queue"
        )
    return None
