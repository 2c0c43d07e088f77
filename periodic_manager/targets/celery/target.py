"""Celery target: each slot becomes a Celery task message, the one ``app.send_task`` would send.

Needs the ``celery`` extra (``pip install 'periodic-manager[celery]'``); Celery is imported only
when a target is built, so the core runs without it.

The message is what ``app.send_task`` makes for the task ``task_type``:

- payload -> arguments: a JSON object becomes keyword arguments, an array positional arguments,
  ``null`` no arguments, any other value one positional argument;
- ``task_id`` = the task id (uuid5 of the idempotency key: the same on every manager);
- headers ``idempotency_key``, ``scheduled_at`` (UTC ISO-8601 with ``Z``) and ``periodic_name``
  (the schedule's name); a Celery task reads them as ``self.request.idempotency_key`` etc.;
- ``options.queue`` -> ``queue`` (without it the app routes as usual: its ``task_routes``, then
  its ``task_default_queue``); ``options.timeout`` -> ``time_limit``; ``options.extra``:
  ``routing_key``, ``exchange``, ``priority`` (0-255), ``soft_time_limit`` (seconds) and
  ``expires`` (seconds after the slot; the worker discards the task after that).
  ``max_retry`` and ``unique_ttl`` have no per-message equivalent in Celery and are not sent.

Two ways out. On a Redis broker, messages to direct exchanges are written by the manager itself
(:mod:`celery_redis`): claim and LPUSH of each task in one Lua script, chunks of a batch in
parallel pipelines, so a burst moves at Redis speed and a slot is claimed only with its message.
Anything else (RabbitMQ or another broker, a topic or fanout exchange, publish signal receivers,
...) is published with kombu (:mod:`celery_kombu`) with publisher confirms (AMQP), under a
*pending* claim in Redis (:mod:`claims`): the claim becomes "sent" once the broker confirmed the
message; a publish that failed, timed out or whose reply was lost leaves it pending, and the
retry publishes the slot again with the same task id (reported ``resent``: the workers may see it
twice when only the confirmation was lost; never lost). A publish never started frees its claim.
Both ways use the same claim keys, so managers on either path never send a slot twice.

``options.overlap`` skip and hold need a result backend (:mod:`celery_results`): the previous
task of a schedule is finished once the backend holds a ready state for its task id, read before
the claim. On the Redis writer the script then compares the schedule's previous-task key
(:mod:`previous`) with what was read, claims the slot and pushes the message in one step; on
kombu's way the compare-and-set takes a pending claim, and the key is marked published after.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from periodic_manager.contracts import QUEUED, EnqueueResult, Prepared, Previous, Task
from periodic_manager.errors import TargetError
from periodic_manager.schedules.definition import slot_text
from periodic_manager.targets import completion
from periodic_manager.targets.base import overlap_of, overlap_refused, split_payload
from periodic_manager.targets.celery.app import REDIS_SCHEMES, app_settings, publishing_app
from periodic_manager.targets.celery.kombu import KombuPublisher
from periodic_manager.targets.celery.results import ResultStates
from periodic_manager.targets.celery.wire import (
    Delivery,
    Layout,
    Routes,
    UnsupportedApp,
    WireFormat,
)
from periodic_manager.targets.celery.writer import RedisWriter, ScriptCall
from periodic_manager.targets.redis.claims import (
    ELSEWHERE,
    NEW,
    RESEND,
    SENT,
    RedisClaims,
)
from periodic_manager.targets.redis.previous import Decided, PreviousTasks
from periodic_manager.targets.redis.sentinel import Sentinel

log = logging.getLogger(__name__)

# Tasks per part of a large batch in enqueue: ~5 ms of building on a slow core, so the event loop
# sends and reads the script calls under way while the rest is built.
STREAM = 250
# How often a slot held pending by another publisher is looked at again (a duration of I/O).
CLAIM_RECHECK_S = 0.1
BEING_PUBLISHED = 5  # the Redis writer's flag of a slot another publisher holds pending


def _seconds(extra: Mapping[str, Any], key: str) -> float | None:
    value = extra.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"options.extra.{key} must be a number of seconds")
    if value <= 0:
        raise ValueError(f"options.extra.{key} must be > 0")
    return float(value)


def _text(extra: Mapping[str, Any], key: str) -> str | None:
    value = extra.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"options.extra.{key} must be a non-empty string")
    return value


def celery_message(task: Task, now: datetime, scheduled_text: str | None = None) -> dict[str, Any]:
    """The keyword arguments of ``app.send_task`` for ``task`` (ValueError if options are bad).

    ``scheduled_text``: ``slot_text(task.scheduled_at)`` when the caller has it already."""
    options = task.options
    extra = options.get("extra") or {}
    if not isinstance(extra, Mapping):
        raise ValueError("options.extra must be a JSON object")
    args, kwargs = split_payload(task.payload)
    msg: dict[str, Any] = {
        "name": task.task_type,
        "args": args,
        "kwargs": kwargs,
        "task_id": task.id,
        "headers": {
            "idempotency_key": task.idempotency_key,
            "scheduled_at": scheduled_text or slot_text(task.scheduled_at),
            "periodic_name": task.name,
        },
        "add_to_parent": False,
    }
    if "queue" in options:
        msg["queue"] = task.queue
    if options.get("timeout") is not None:
        msg["time_limit"] = float(options["timeout"])
    if extra:
        _extra(msg, extra, task, now)
    return msg


def _extra(msg: dict[str, Any], extra: Mapping[str, Any], task: Task, now: datetime) -> None:
    """``options.extra`` into the send_task arguments ``msg``."""
    for key in ("routing_key", "exchange"):
        value = _text(extra, key)
        if value is not None:
            msg[key] = value
    priority = extra.get("priority")
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 255:
            raise ValueError("options.extra.priority must be an integer from 0 to 255")
        msg["priority"] = priority
    soft = _seconds(extra, "soft_time_limit")
    if soft is not None:
        msg["soft_time_limit"] = soft
    expires = _seconds(extra, "expires")
    if expires is not None:
        # Relative seconds, counted on the manager's clock from the slot; Celery turns them into
        # an absolute instant when it builds the message.
        end = task.scheduled_at.astimezone(UTC) + timedelta(seconds=expires)
        msg["expires"] = max(0.0, (end - now.astimezone(UTC)).total_seconds())


def _written(task: Task, delivery: Delivery, flag: int) -> EnqueueResult:
    """The result of a task the Redis writer's script took (see its flags)."""
    if flag == 1:
        return EnqueueResult(task, "enqueued", task.id)
    if flag == 0:
        return EnqueueResult(task, "duplicate", task.id)
    if flag == 4:
        return EnqueueResult(task, "resent", task.id)
    if flag == 3:  # another manager sent a task of this schedule since it was read
        return EnqueueResult(task, "busy", previous=Previous(None, QUEUED))
    error = (
        f"celery: no queue is bound to exchange {delivery.exchange!r} with routing key "
        f"{delivery.routing_key!r}"
    )
    return EnqueueResult(task, "failed", error=error)


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
    # options.overlap tasks the Redis writer takes: written at send, after their previous task
    # was read (index, send_task arguments, delivery).
    after: list[tuple[int, dict[str, Any], Delivery]] = field(default_factory=list)
    kombu: list[int] = field(default_factory=list)  # tasks published through kombu at send


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
            PreviousTasks(claims, results, publish_window_s=2 * timeout) if results else None
        )
        self._kombu = KombuPublisher(app, timeout)
        self.sentinel = Sentinel(claims.client, f"{claims.prefix}:sentinel")
        self._owned_clients: list[aioredis.Redis] = []
        self._owns_app = False
        self._warned_signals = False
        self.routes: Routes | None = None
        self.writer: RedisWriter | None = None
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
        self.fast_path_off = None

    @classmethod
    def from_url(
        cls,
        broker_url: str,
        *,
        claims_url: str | None = None,
        prefix: str = "pm",
        claim_margin: float = 60.0,
        timeout: float = 5.0,
        config: Mapping[str, Any] | None = None,
        fast_path: bool = True,
        result_backend: str | None = None,
    ) -> CeleryTarget:
        """A target with its own Celery app on ``broker_url`` (``config``: more Celery settings,
        e.g. ``task_routes`` or ``broker_transport_options``) and its own claims client.

        Claims live in ``claims_url``; by default in the broker itself when it is Redis.
        ``result_backend``: where the workers store results (``options.overlap`` needs it).
        """
        settings = {**(config or {}), "broker_url": broker_url}
        return cls._build(
            "periodic_manager", settings, claims_url=claims_url, prefix=prefix,
            claim_margin=claim_margin, timeout=timeout, fast_path=fast_path,
            result_backend=result_backend,
        )  # fmt: skip

    @classmethod
    def from_app(
        cls,
        app: Any,
        *,
        broker_url: str | None = None,
        claims_url: str | None = None,
        prefix: str = "pm",
        claim_margin: float = 60.0,
        timeout: float = 5.0,
        fast_path: bool = True,
        result_backend: str | None = None,
    ) -> CeleryTarget:
        """A target honouring the settings of the user's Celery ``app`` (broker, queues, routes,
        default queue/exchange/routing key, transport options), published with an app of its own
        (see :mod:`celery_app`). ``broker_url`` overrides the app's; ``result_backend`` (default:
        the app's) is read to tell when a task finished (``options.overlap``)."""
        settings = app_settings(app)
        if broker_url is not None:
            settings["broker_url"] = broker_url
        backend = result_backend or app.conf.result_backend
        return cls._build(
            app.main or "periodic_manager", settings, claims_url=claims_url, prefix=prefix,
            claim_margin=claim_margin, timeout=timeout, fast_path=fast_path,
            result_backend=backend if isinstance(backend, str) and backend != "disabled" else None,
        )  # fmt: skip

    @classmethod
    def _build(
        cls,
        main: str,
        settings: Mapping[str, Any],
        *,
        claims_url: str | None,
        prefix: str,
        claim_margin: float,
        timeout: float,
        fast_path: bool,
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
                claims_url, max_connections=10, timeout=timeout, socket_timeout=timeout,
                socket_connect_timeout=timeout, **(ssl if isinstance(ssl, Mapping) else {}),
            )
        )  # fmt: skip
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
        longer). Tasks published through kombu are only sorted out here; their messages are
        built when sent."""
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
                data.after.append((index, msg, delivery))
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
            results[index] = EnqueueResult(tasks[index], "failed", error=error)
        parts = []
        if data.calls:
            parts.append(self._send_written(tasks, data, results, now, started))
        if data.after:
            parts.append(self._send_written_after(tasks, data, results, now))
        if data.kombu:
            parts.append(self._send_kombu(tasks, data.kombu, results, now))
        outcomes = await asyncio.gather(*parts, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return [r for r in results if r is not None]

    async def _write(self, calls: list[asyncio.Future[Any]]) -> list[int]:
        assert self.writer is not None
        try:
            return await self.writer.results(calls)
        except TimeoutError as exc:
            raise TargetError(f"celery: redis: no answer within {self.timeout:g} s") from exc
        except (RedisError, OSError) as exc:
            raise TargetError(f"celery: redis: {type(exc).__name__}: {exc}") from exc

    async def _send_written(
        self,
        tasks: Sequence[Task],
        data: CeleryPrepared,
        results: list[EnqueueResult | None],
        now: datetime,
        started: list[asyncio.Future[Any]] | None,
    ) -> None:
        assert self.writer is not None
        flags = await self._write(started or self.writer.start(data.calls))
        waiting: dict[int, tuple[dict[str, Any], Delivery]] = {}
        for (index, delivery), flag in zip(data.written, flags, strict=True):
            if flag == BEING_PUBLISHED:
                waiting[index] = (celery_message(tasks[index], now), delivery)
            else:
                results[index] = _written(tasks[index], delivery, flag)
        if waiting:

            async def again(ask: list[int]) -> list[int]:
                return await self._write_items(tasks, waiting, ask, now, results)

            await self._claim_until_free(again, list(waiting))

    async def _send_written_after(
        self,
        tasks: Sequence[Task],
        data: CeleryPrepared,
        results: list[EnqueueResult | None],
        now: datetime,
    ) -> None:
        """options.overlap on the Redis writer: the previous tasks are read, then each free slot
        is claimed and written in the script that compares its schedule's previous-task key."""
        assert self.writer is not None and self.previous is not None
        decided = await self.previous.read(tasks, [i for i, _, _ in data.after], now, flag="1")
        for index, result in decided.results.items():
            results[index] = result
        chosen = {index: (msg, delivery) for index, msg, delivery in data.after}

        async def write(ask: list[int]) -> list[int]:
            return await self._write_items(tasks, chosen, ask, now, results, decided)

        await self._claim_until_free(write, decided.free)

    async def _write_items(
        self,
        tasks: Sequence[Task],
        chosen: Mapping[int, tuple[dict[str, Any], Delivery]],
        indices: list[int],
        now: datetime,
        results: list[EnqueueResult | None],
        decided: Decided | None = None,
    ) -> list[int]:
        """Write the tasks of ``indices`` (their send_task arguments and delivery in
        ``chosen``; with ``decided``, the compare-and-set of their previous-task keys) and set
        their results; returns those a publish through kombu holds pending (ask again)."""
        assert self.writer is not None
        items = [(tasks[i], *chosen[i]) for i in indices]
        prevs = [decided.written[i] for i in indices] if decided is not None else None
        flags = await self._write(self.writer.start(self.writer.prepare(items, now, prevs)))
        waiting = []
        for index, flag in zip(indices, flags, strict=True):
            if flag == BEING_PUBLISHED:
                waiting.append(index)
                continue
            result = _written(tasks[index], chosen[index][1], flag)
            if decided is not None and result.status != "busy":
                result.previous = decided.previous.get(index)
            results[index] = result
        return waiting

    async def _send_kombu(
        self,
        tasks: Sequence[Task],
        indices: list[int],
        results: list[EnqueueResult | None],
        now: datetime,
    ) -> None:
        """Publish through kombu: each slot first takes a pending claim, which becomes "sent"
        once the broker confirmed the message (module :mod:`claims`)."""
        # Built at the instant: send_task counts a relative expiry from its own clock.
        messages = {index: celery_message(tasks[index], now) for index in indices}
        publish: list[int] = []
        resend: set[int] = set()

        async def claim_plain(ask: list[int]) -> list[int]:
            flags = await self.claims.claim([tasks[i] for i in ask], now)
            for index, flag in zip(ask, flags, strict=True):
                if flag == SENT:
                    results[index] = EnqueueResult(tasks[index], "duplicate", tasks[index].id)
                elif flag in (NEW, RESEND):
                    publish.append(index)
                    if flag == RESEND:
                        resend.add(index)
            return [i for i, flag in zip(ask, flags, strict=True) if flag == ELSEWHERE]

        await self._claim_until_free(claim_plain, [i for i in indices if overlap_of(tasks[i]) == "allow"])
        decided: Decided | None = None
        after = [i for i in indices if overlap_of(tasks[i]) != "allow"]
        if after:
            assert self.previous is not None  # refused in _prepare without a result backend
            previous = self.previous
            decided = chosen = await previous.read(tasks, after, now, flag="0")

            async def claim_after(ask: list[int]) -> list[int]:
                return await previous.claim_pending(tasks, chosen, ask, now)

            await self._claim_until_free(claim_after, decided.free)
            for index, result in decided.results.items():
                results[index] = result
            publish += decided.claimed
            resend |= decided.resend
        if not publish:
            return
        job = self._kombu.start([messages[index] for index in publish])
        try:
            taken, unknown, error = await self._kombu.wait(job)
        except asyncio.CancelledError:
            # The manager is stopping: publish nothing more, and free the slots not started so
            # that a standby or a restart may send them.
            taken, unknown = self._kombu.stop(job)
            await asyncio.shield(self._settle(tasks, publish, taken, unknown, decided))
            raise
        for index in publish[:taken]:
            status: Any = "resent" if index in resend else "enqueued"
            results[index] = EnqueueResult(tasks[index], status, tasks[index].id)
            if decided is not None and index in decided.written:
                results[index].previous = decided.previous.get(index)  # type: ignore[union-attr]
        await self._settle(tasks, publish, taken, unknown, decided)
        if error is None:
            return
        unconfirmed = f" ({unknown} unconfirmed, published again by a retry)" if unknown else ""
        raise TargetError(
            f"celery: published {taken} of {len(publish)} task(s){unconfirmed}: {error}"
        ) from error

    async def _claim_until_free(
        self, ask: Callable[[list[int]], Awaitable[list[int]]], indices: list[int]
    ) -> None:
        """Claim ``indices`` with ``ask`` (it returns those another publisher holds pending) and
        ask again for those until they are sent or abandoned: at most the claims' stale time
        (a publish elsewhere ends, or is given up, well before)."""
        if not indices:
            return
        waiting = await ask(indices)
        deadline = time.monotonic() + self.claims.stale_ms / 1000 + 1  # a duration, not a slot
        while waiting:
            if time.monotonic() > deadline:
                raise TargetError(f"celery: {len(waiting)} slot(s) held by another publisher")
            await asyncio.sleep(CLAIM_RECHECK_S)  # the other publisher's broker answers meanwhile
            waiting = await ask(waiting)

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

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        """A task is finished once the result backend holds a ready state for it: that needs the
        backend (:mod:`results`)."""
        backend = "configured" if self.results is not None else None
        return completion.celery(backend) if completion.asks(options) else None

    async def ping(self) -> None:
        """Raise unless the claims' Redis and the broker the messages go to answer, each within
        ``timeout`` (a readiness check). Written to Redis directly, the broker is the claims'
        Redis; otherwise (RabbitMQ, another Redis, ...) a connection is opened to it with
        kombu, in a thread of its own (never behind a publish under way)."""
        async with asyncio.timeout(self.timeout):
            await self.claims.ping()
        if self.writer is not None and not self._kombu_needed():
            return
        try:
            async with asyncio.timeout(self.timeout):
                await asyncio.to_thread(self._connect_broker)
        except TimeoutError:
            raise TargetError(f"celery: the broker did not answer within {self.timeout:g} s") from None
        except Exception as exc:  # noqa: BLE001 - kombu's transports raise many types
            raise TargetError(f"celery: broker: {type(exc).__name__}: {exc}") from exc

    def _kombu_needed(self) -> bool:
        """Whether messages may go through kombu although the Redis writer is on (publish
        signal receivers make every message take kombu's way)."""
        return _publish_receivers()

    def _connect_broker(self) -> None:
        with self.app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=self.timeout)

    async def forgotten(self) -> list[str]:
        """``["celery"]`` when the claims' Redis lost its data since the previous call."""
        async with asyncio.timeout(self.timeout):
            return [self.name] if await self.sentinel.lost() else []

    async def close(self) -> None:
        """Stop the publishing thread; close the app and clients this target created."""
        if self._owns_app:
            closing = asyncio.wrap_future(self._kombu.close_app())
            # Behind a publish that never returned this would wait forever: bounded.
            await asyncio.wait({closing}, timeout=self.timeout)
        self._kombu.shutdown()
        if self.results is not None and self._owns_app:
            self.results.close()
        for client in self._owned_clients:
            await client.aclose()
