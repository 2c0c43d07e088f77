"""Celery target: each slot becomes a Celery task message, the one ``app.send_task`` would send
(:mod:`~periodic_manager.targets.celery.message`).

Needs the ``celery`` extra (``pip install 'periodic-manager[celery]'``); Celery is imported only
when a target is built, so the core runs without it.

Two ways out, sorted per task when a batch is prepared. On a Redis broker, messages to direct
exchanges are written by the manager itself (:mod:`~periodic_manager.targets.celery.direct`):
claim and LPUSH of each task in one Lua script, chunks of a batch in parallel, so a burst moves
at Redis speed and a slot is claimed only with its message. Anything else is published with kombu
under a pending claim that the broker's confirmation turns into sent
(:mod:`~periodic_manager.targets.redis.pending`). Both ways use the same claim keys, so
managers on either way never send a slot twice.

``options.overlap`` skip and hold need a result backend
(:mod:`~periodic_manager.targets.celery.results`): the previous task of a schedule is finished
once the backend holds a ready state for its task id, read before the claim.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypedDict, Unpack

import redis.asyncio as aioredis

from periodic_manager.contracts import EnqueueResult, Prepared, Task, refused
from periodic_manager.errors import TargetError
from periodic_manager.schedules.instants import slot_text
from periodic_manager.targets import completion
from periodic_manager.targets.base import overlap_refused
from periodic_manager.targets.builtin.celery import CELERY_NO_BACKEND, no_signal
from periodic_manager.targets.celery.app import REDIS_SCHEMES, app_settings, publishing_app
from periodic_manager.targets.celery.direct import DirectWay
from periodic_manager.targets.celery.kombu import CeleryOutlet
from periodic_manager.targets.celery.message import celery_message
from periodic_manager.targets.celery.results import ResultStates, outcome_of
from periodic_manager.targets.celery.wire import (
    Delivery,
    Layout,
    Routes,
    UnsupportedApp,
    WireFormat,
)
from periodic_manager.targets.celery.writer import RedisWriter, ScriptCall
from periodic_manager.targets.publisher import ThreadPublisher
from periodic_manager.targets.redis.claims import RedisClaims
from periodic_manager.targets.redis.pending import PendingWay
from periodic_manager.targets.redis.previous import PreviousTasks
from periodic_manager.targets.redis.sentinel import Sentinel

log = logging.getLogger(__name__)

# Tasks per part of a large batch built at the instant (enqueue): small enough that the event
# loop gets a turn between parts to send and read the script calls under way while the rest is
# built, large enough that a part's script call is worth its round trip.
STREAM = 250


def _publish_receivers() -> bool:
    """Whether anything listens to Celery's publish signals (they run only on kombu's path)."""
    from celery import signals

    return bool(
        signals.before_task_publish.receivers
        or signals.after_task_publish.receivers
        or signals.task_sent.receivers
    )


@dataclass
class CeleryPrepared:
    """What :meth:`CeleryTarget.prepare` builds for a batch (``Prepared.data``); may be sent again."""

    refused: dict[int, str] = field(default_factory=dict)  # task index -> why Celery can't take it
    calls: list[ScriptCall] = field(default_factory=list)  # the Redis writer's script calls
    written: list[tuple[int, Delivery]] = field(default_factory=list)  # their tasks, in call order
    # options.overlap tasks the Redis writer takes: built and written at send, after their
    # previous task was read (index, delivery).
    after: list[tuple[int, Delivery]] = field(default_factory=list)
    kombu: list[int] = field(default_factory=list)  # tasks published through kombu at send


class BuildOptions(TypedDict, total=False):
    """What :meth:`CeleryTarget.from_url` and :meth:`CeleryTarget.from_app` pass on to the
    target: where the claims live (default: in a Redis broker), their key prefix and margin, the
    publish timeout, the fast path, and the result backend."""

    claims_url: str | None
    prefix: str
    claim_margin: float
    timeout: float
    fast_path: bool
    result_backend: str | None


class CeleryTarget:
    """Sends tasks to Celery workers, once per idempotency key.

    ``app``: the Celery app to publish with (its result backend is not used: give it an app without
    one, as :meth:`from_url` and :meth:`from_app` do). ``claims``: where slots are claimed.
    ``broker_client``: a client of the app's Redis broker, also the claims' client; with it, tasks
    routed to direct exchanges are written to Redis directly (see the module docstring).
    ``timeout`` bounds every broker operation: one kombu publish from its start (a batch waiting
    for the publishing thread is not timed), one script call of the Redis writer.
    """

    name = "celery"

    def __init__(
        self,
        app: Any,
        claims: RedisClaims,
        *,
        timeout: float = 5.0,
        broker_client: aioredis.Redis | None = None,
        results: ResultStates | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        self.app = app
        self.claims = claims
        self.timeout = timeout
        # options.overlap: the result backend tells when a task finished.
        self.results = results
        self.previous = (
            PreviousTasks(claims, results, publish_window_s=2 * timeout)
            if results is not None
            else None
        )
        self._publisher = ThreadPublisher(CeleryOutlet(app), timeout, "pm-celery-publish")
        self.kombu = PendingWay("celery", self._publisher, claims, self.previous, celery_message)
        self.sentinel = Sentinel(claims.client, f"{claims.prefix}:sentinel", timeout=timeout)
        self._owned_clients: list[aioredis.Redis] = []
        self._owns_app = False
        self._warned_signals = False
        self.routes: Routes | None = None
        self.writer: RedisWriter | None = None
        self.direct: DirectWay | None = None  # with the writer
        # Why every message goes through kombu (None: the Redis writer takes what it can).
        self.fast_path_off: str | None = "no Redis broker client"
        if broker_client is not None:
            if broker_client is not claims.client:
                raise ValueError(
                    "broker_client must be the claims' client (claims live beside the messages)"
                )
            self._enable_writer(broker_client)

    def _enable_writer(self, client: aioredis.Redis) -> None:
        if self.app.conf.task_send_sent_event:
            self.fast_path_off = "task_send_sent_event is on (kombu sends the task-sent events)"
            return
        try:
            layout = Layout.of(self.app)
            wire = WireFormat(self.app)
        except UnsupportedApp as exc:
            self.fast_path_off = str(exc)
            return
        self.routes = Routes(self.app, layout)
        self.writer = RedisWriter(
            client, wire, layout=layout, claims=self.claims, timeout=self.timeout
        )
        self.direct = DirectWay(self.writer, self.claims, self.previous)
        self.fast_path_off = None

    @classmethod
    def from_url(
        cls,
        broker_url: str,
        *,
        config: Mapping[str, Any] | None = None,
        **options: Unpack[BuildOptions],
    ) -> CeleryTarget:
        """A target with its own Celery app on ``broker_url`` (``config``: more Celery settings,
        e.g. ``task_routes`` or ``broker_transport_options``) and its own claims client.

        Claims live in ``claims_url``; by default in the broker itself when it is Redis.
        ``result_backend``: where the workers store results (``options.overlap`` needs it).
        """
        settings = {**(config or {}), "broker_url": broker_url}
        return cls._build("periodic_manager", settings, **options)

    @classmethod
    def from_app(
        cls, app: Any, *, broker_url: str | None = None, **options: Unpack[BuildOptions]
    ) -> CeleryTarget:
        """A target honouring the settings of the user's Celery ``app`` (broker, queues, routes,
        default queue/exchange/routing key, transport options), published with an app of its own
        (see :mod:`~periodic_manager.targets.celery.app`). ``broker_url`` overrides the app's;
        ``result_backend`` (default: the app's) is read to tell when a task finished
        (``options.overlap``)."""
        settings = app_settings(app)
        if broker_url is not None:
            settings["broker_url"] = broker_url
        backend = options.get("result_backend") or app.conf.result_backend
        options["result_backend"] = (
            backend if isinstance(backend, str) and backend != "disabled" else None
        )
        return cls._build(app.main or "periodic_manager", settings, **options)

    @classmethod
    def _build(
        cls,
        main: str,
        settings: Mapping[str, Any],
        *,
        claims_url: str | None = None,
        prefix: str = "pm",
        claim_margin: float = 60.0,
        timeout: float = 5.0,
        fast_path: bool = True,
        result_backend: str | None = None,
    ) -> CeleryTarget:
        app = publishing_app(main, settings, broker_url=None, timeout=timeout)
        broker = app.conf.broker_url
        redis_broker = (
            isinstance(broker, str) and broker.startswith(REDIS_SCHEMES) and ";" not in broker
        )
        if claims_url is None:
            if not redis_broker:
                raise ValueError("a non-Redis broker needs claims_url (a Redis URL for the claims)")
            claims_url = broker
        ssl = app.conf.broker_use_ssl if claims_url == broker else None
        client = aioredis.Redis.from_pool(
            aioredis.BlockingConnectionPool.from_url(
                claims_url,
                max_connections=10,
                timeout=timeout,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                **(ssl if isinstance(ssl, Mapping) else {}),
            )
        )
        direct = fast_path and redis_broker and claims_url == broker
        # A pending claim of another publisher is abandoned once older than any publish of it
        # can take (one timeout per operation, a second one to learn its outcome).
        claims = RedisClaims(client, prefix=prefix, margin=claim_margin, stale_s=3 * timeout + 1)
        results = None
        if result_backend:
            results = ResultStates(result_backend, settings, timeout=timeout)
        target = cls(
            app, claims, timeout=timeout, broker_client=client if direct else None, results=results
        )
        if not fast_path:
            target.fast_path_off = "switched off (PM_CELERY_FAST_PATH=false)"
        target._owned_clients.append(client)
        target._owns_app = True
        if target.fast_path_off is None:
            log.info(
                "celery target: messages to direct exchanges are written to the Redis broker "
                "directly"
            )
        else:
            log.info("celery target: publishing through kombu: %s", target.fast_path_off)
        return target

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        """Claim every task, send the claimed ones, report each in input order.

        A large batch is prepared and sent in parts of ``STREAM``: each part's script calls start
        as soon as the part is built, and the event loop gets a turn between parts, so Redis
        works on one part while the next is built (a batch prepared whole would reach Redis only
        after all of it was built)."""
        if self.writer is None or len(tasks) <= STREAM:
            return await self._send(tasks, self._prepare(tasks, now), now)
        sends: list[asyncio.Future[list[EnqueueResult]]] = []
        try:
            for start in range(0, len(tasks), STREAM):
                part = tasks[start : start + STREAM]
                data = self._prepare(part, now)
                started = self.writer.start(data.calls)
                sends.append(asyncio.ensure_future(self._send(part, data, now, started)))
                await asyncio.sleep(0)
            outcomes = await asyncio.gather(*sends, return_exceptions=True)
        except asyncio.CancelledError:
            for fut in sends:
                fut.cancel()
            raise
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return [r for part in outcomes for r in part]  # type: ignore[union-attr]

    def prepare(self, tasks: Sequence[Task]) -> Prepared:
        """Everything of a batch that needs no broker, done before its instant: messages, routes
        and the Redis writer's script arguments. No I/O, no clock: claim TTLs and relative
        expiries count from each task's slot (a batch sent later keeps its claims that much
        longer). Tasks published through kombu, and options.overlap tasks (written only after
        their previous task was read), are only sorted out and routed here; their messages are
        built when sent, so that a relative expiry counts from the send."""
        return Prepared(list(tasks), self._prepare(tasks, None))

    async def send(self, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
        """Send a prepared batch at ``now`` (again, on a retry: the claims make that safe).
        Raises TargetError if a broker failed; the tasks sent before it keep their claims, the
        others hold none."""
        if not isinstance(prepared.data, CeleryPrepared):
            return await self.enqueue(prepared.tasks, now)
        return await self._send(prepared.tasks, prepared.data, now)

    def _prepare(self, tasks: Sequence[Task], now: datetime | None) -> CeleryPrepared:
        """``now``: when the batch is sent; None: at each task's slot (staged ahead)."""
        data = CeleryPrepared()
        direct = self.writer is not None and self._direct_allowed()
        written: list[tuple[Task, dict[str, Any], Delivery]] = []
        slots: dict[datetime, str] = {}  # a burst shares one slot: formatted once
        for index, task in enumerate(tasks):
            # options.overlap: the previous task is read at send (module docstring).
            after = task.options.get("overlap", "allow") != "allow"
            if after and (why := overlap_refused(self, task)) is not None:
                data.refused[index] = f"celery: {why}"
                continue
            try:
                text = slots.get(task.scheduled_at)
                if text is None:
                    text = slots[task.scheduled_at] = slot_text(task.scheduled_at)
                msg = celery_message(task, task.scheduled_at if now is None else now, text)
                delivery = self._route(msg, direct)
            except Exception as exc:  # noqa: BLE001 - bad options, a router's error: this task only
                data.refused[index] = f"celery: {type(exc).__name__}: {exc}"
                continue
            if delivery is None:
                data.kombu.append(index)
            elif after:
                data.after.append((index, delivery))
            else:
                data.written.append((index, delivery))
                written.append((task, msg, delivery))
        if written:
            assert self.writer is not None
            data.calls = self.writer.prepare(written, now)
        return data

    def _direct_allowed(self) -> bool:
        if not _publish_receivers():
            return True
        if not self._warned_signals:
            self._warned_signals = True
            log.warning(
                "celery target: publish signal receivers are connected: publishing through kombu "
                "so they run"
            )
        return False

    def _route(self, msg: dict[str, Any], direct: bool) -> Delivery | None:
        if direct:
            assert self.routes is not None
            return self.routes.resolve(msg)
        # kombu's path routes again when it publishes; resolving here refuses an unroutable task
        # alone instead of stopping the publishing of the batch at it.
        opts = {k: msg[k] for k in ("queue", "exchange", "routing_key", "priority") if k in msg}
        self.app.amqp.router.route(opts, msg["name"], msg["args"], msg["kwargs"])
        return None

    async def _send(
        self,
        tasks: Sequence[Task],
        data: CeleryPrepared,
        now: datetime,
        started: list[asyncio.Future[Any]] | None = None,
    ) -> list[EnqueueResult]:
        results: list[EnqueueResult | None] = [None] * len(tasks)
        for index, error in data.refused.items():
            results[index] = refused(tasks[index], error)
        parts = []
        if data.calls:
            assert self.direct is not None
            parts.append(self.direct.send(tasks, data.calls, data.written, results, now, started))
        if data.after:
            assert self.direct is not None
            parts.append(self.direct.send_after(tasks, data.after, results, now))
        if data.kombu:
            parts.append(self.kombu.send(tasks, data.kombu, results, now))
        outcomes = await asyncio.gather(*parts, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return [r for r in results if r is not None]

    def failure_off(self, options: Mapping[str, Any]) -> str | None:
        """The result backend tells a failed task (FAILURE); without one Celery cannot tell."""
        return no_signal(self.results is not None) if completion.fails(options) else None

    async def outcomes(self, options: Mapping[str, Any], task_ids: Sequence[str]) -> list[str]:
        """Each task's outcome from the result backend (:func:`results.outcome_of`); raises
        TargetError without one, or when it cannot be read."""
        if self.results is None:
            raise TargetError(f"celery: {CELERY_NO_BACKEND}")
        try:
            statuses = await self.results.statuses(task_ids)
        except Exception as exc:  # noqa: BLE001 - the backend's own errors
            raise TargetError(
                f"celery: cannot read task results: {type(exc).__name__}: {exc}"
            ) from exc
        return [outcome_of(status) for status in statuses]

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        """A task is finished once the result backend holds a ready state for it: that needs the
        backend (:mod:`~periodic_manager.targets.celery.results`)."""
        return no_signal(self.results is not None) if completion.asks(options) else None

    async def ping(self) -> None:
        """Raise unless the claims' Redis and the broker the messages go to answer, each within
        ``timeout`` (a readiness check). Written to Redis directly, the broker is the claims'
        Redis; otherwise (RabbitMQ, another Redis, ...) a connection is opened to it with
        kombu, in a thread of its own (never behind a publish under way)."""
        async with asyncio.timeout(self.timeout):
            await self.claims.ping()
        if self.writer is not None and not _publish_receivers():
            return  # the broker is the claims' Redis, which just answered
        try:
            async with asyncio.timeout(self.timeout):
                await asyncio.to_thread(self._connect_broker)
        except TimeoutError:
            raise TargetError(f"celery: broker: no answer within {self.timeout:g} s") from None
        except Exception as exc:  # noqa: BLE001 - kombu's transports raise many types
            raise TargetError(f"celery: broker: {type(exc).__name__}: {exc}") from exc

    def _connect_broker(self) -> None:
        with self.app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=self.timeout)

    async def forgotten(self) -> list[str]:
        """``["celery"]`` when the claims' Redis lost its data since the previous call."""
        return [self.name] if await self.sentinel.lost() else []

    async def close(self) -> None:
        """Stop the publishing thread; close the app and clients this target created."""
        if self._owns_app:
            closing = asyncio.wrap_future(self._publisher.close_outlet())
            # Behind a publish that never returned this would wait forever: bounded.
            await asyncio.wait({closing}, timeout=self.timeout)
        self._publisher.shutdown()
        if self.results is not None and self._owns_app:
            self.results.close()
        for client in self._owned_clients:
            await client.aclose()
