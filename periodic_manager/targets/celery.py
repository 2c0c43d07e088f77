"""Celery target: each slot becomes a Celery task message, published by name with Celery's producer.

Needs the ``celery`` extra (``pip install 'periodic-manager[celery]'``); Celery is imported only
when a target is built, so the core runs without it.

The message is what ``app.send_task`` makes for the task ``task_type``:

- payload -> arguments: a JSON object becomes keyword arguments, an array positional arguments,
  ``null`` no arguments, any other value one positional argument;
- ``task_id`` = the task id (uuid5 of the idempotency key: the same on every manager);
- headers ``idempotency_key``, ``scheduled_at`` (UTC ISO-8601 with ``Z``) and ``periodic_name``
  (the schedule's name); a Celery task reads them as ``self.request.idempotency_key`` etc.;
- ``options.queue`` -> ``queue`` (without it Celery routes as usual: ``task_routes``, then the
  app's default queue, ``celery``); ``options.timeout`` -> ``time_limit``; ``options.extra``:
  ``routing_key``, ``exchange``, ``priority`` (0-255), ``soft_time_limit`` (seconds) and
  ``expires`` (seconds after the slot; the worker discards the task after that).
  ``max_retry`` and ``unique_ttl`` have no per-message equivalent in Celery and are not sent.

Exactly once per slot: the slot is claimed in Redis (:class:`RedisClaims`) before it is published;
a publish that fails releases its claim, so the scheduler's retry publishes it then.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import redis.asyncio as aioredis

from periodic_manager.config import slot_text
from periodic_manager.errors import TargetError
from periodic_manager.targets.base import EnqueueResult, Task
from periodic_manager.targets.claims import RedisClaims, split_payload

log = logging.getLogger(__name__)

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def _import_celery() -> Any:
    try:
        import celery
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise TargetError(
            "the celery target needs Celery: pip install 'periodic-manager[celery]'"
        ) from exc
    return celery


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


def celery_message(task: Task, now: datetime) -> dict[str, Any]:
    """The keyword arguments of ``app.send_task`` for ``task`` (ValueError if options are bad)."""
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
            "scheduled_at": slot_text(task.scheduled_at),
            "periodic_name": task.name,
        },
        "add_to_parent": False,
    }
    if "queue" in options:
        msg["queue"] = task.queue
    for key in ("routing_key", "exchange"):
        value = _text(extra, key)
        if value is not None:
            msg[key] = value
    priority = extra.get("priority")
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 255:
            raise ValueError("options.extra.priority must be an integer from 0 to 255")
        msg["priority"] = priority
    if options.get("timeout") is not None:
        msg["time_limit"] = float(options["timeout"])
    soft = _seconds(extra, "soft_time_limit")
    if soft is not None:
        msg["soft_time_limit"] = soft
    expires = _seconds(extra, "expires")
    if expires is not None:
        # Relative seconds, counted on the manager's clock from the slot; Celery turns them into
        # an absolute instant when it builds the message.
        end = task.scheduled_at.astimezone(UTC) + timedelta(seconds=expires)
        msg["expires"] = max(0.0, (end - now.astimezone(UTC)).total_seconds())
    return msg


class CeleryTarget:
    """Publishes tasks to Celery workers, once per idempotency key.

    ``app``: a Celery app configured for the broker (its result backend is not used: give it an
    app without one, as :meth:`from_url` does). ``claims``: where slots are claimed. Publishing is
    synchronous in kombu, so a batch is published in one worker thread of this target; tasks not
    yet started ``timeout`` seconds after the batch began are not published (their claims are
    released and TargetError is raised, so the scheduler retries them within grace).
    """

    name = "celery"

    def __init__(self, app: Any, claims: RedisClaims, *, timeout: float = 5.0) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        self.app = app
        self.claims = claims
        self.timeout = timeout
        # One thread (started on the first publish): kombu connections are not thread-safe, and
        # batches are sequential anyway.
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="pm-celery-publish"
        )
        self._owned_clients: list[aioredis.Redis] = []
        self._owns_app = False

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
    ) -> CeleryTarget:
        """A target with its own Celery app on ``broker_url`` and its own claims client.

        Claims live in ``claims_url``; by default in the broker itself when it is Redis.
        ``config`` is applied to the app (``app.conf.update``), e.g. ``task_routes``; its
        ``broker_transport_options`` are merged into the socket timeouts set here.
        """
        if claims_url is None:
            if not broker_url.startswith(_REDIS_SCHEMES):
                raise ValueError("a non-Redis broker needs claims_url (a Redis URL for the claims)")
            claims_url = broker_url
        celery = _import_celery()
        app = celery.Celery("periodic_manager", broker=broker_url, set_as_current=False)
        config = dict(config or {})
        transport: dict[str, Any] = {}
        if broker_url.startswith(_REDIS_SCHEMES):
            transport = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        transport.update(config.pop("broker_transport_options", None) or {})
        app.conf.update(
            {
                "broker_connection_timeout": timeout,
                "broker_transport_options": transport,
                "task_serializer": "json",
                "accept_content": ["json"],
                **config,
            }
        )
        client = aioredis.Redis.from_pool(
            aioredis.BlockingConnectionPool.from_url(
                claims_url,
                max_connections=4,
                timeout=timeout,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
            )
        )
        target = cls(app, RedisClaims(client, prefix=prefix, margin=claim_margin), timeout=timeout)
        target._owned_clients.append(client)
        target._owns_app = True
        return target

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        """Claim every task, publish the claimed ones, report each in input order."""
        if not tasks:
            return []
        results: list[EnqueueResult | None] = [None] * len(tasks)
        messages: dict[int, dict[str, Any]] = {}
        for index, task in enumerate(tasks):
            try:
                messages[index] = celery_message(task, now)
            except (TypeError, ValueError) as exc:
                results[index] = EnqueueResult(task, "failed", error=f"celery: {exc}")
        order = list(messages)
        won = await self.claims.claim([tasks[i] for i in order], now)
        publish = [i for i, ok in zip(order, won, strict=True) if ok]
        for index, ok in zip(order, won, strict=True):
            if not ok:
                results[index] = EnqueueResult(tasks[index], "duplicate", tasks[index].id)
        done, error = await self._publish([messages[i] for i in publish])
        for index in publish[:done]:
            results[index] = EnqueueResult(tasks[index], "enqueued", tasks[index].id)
        if error is not None:
            unpublished = [tasks[i] for i in publish[done:]]
            try:
                await self.claims.release(unpublished)
            except TargetError as exc:
                log.error(
                    "could not release %d claim(s) after a failed publish (they expire by "
                    "themselves): %s",
                    len(unpublished),
                    exc,
                )
            raise TargetError(
                f"celery: published {done} of {len(publish)} task(s): {error}"
            ) from error
        return [r for r in results if r is not None]

    async def _publish(self, messages: list[dict[str, Any]]) -> tuple[int, BaseException | None]:
        """Publish in this target's thread; (how many were published, the error that stopped it)."""
        if not messages:
            return 0, None
        stop = threading.Event()
        progress = [0]
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, self._publish_sync, messages, stop, progress)
        finished, _ = await asyncio.wait({future}, timeout=self.timeout)
        if not finished:
            stop.set()  # the message in flight finishes; no further one starts
            finished, _ = await asyncio.wait({future}, timeout=self.timeout)
            if not finished:
                # Still stuck in one publish: its outcome is unknown, so its claim is kept
                # (at most once for that slot); the ones after it were never started.
                return progress[0] + 1, TimeoutError(
                    f"a publish did not return within {2 * self.timeout:g} s"
                )
        return future.result()

    def _publish_sync(
        self, messages: list[dict[str, Any]], stop: threading.Event, progress: list[int]
    ) -> tuple[int, BaseException | None]:
        try:
            with self.app.producer_or_acquire() as producer:
                for msg in messages:
                    if stop.is_set():
                        return progress[0], TimeoutError(
                            f"publishing took longer than {self.timeout:g} s"
                        )
                    self.app.send_task(producer=producer, **msg)
                    progress[0] += 1
        except Exception as exc:  # kombu and the transports raise a wide spread of types
            return progress[0], exc
        return progress[0], None

    async def close(self) -> None:
        """Stop the publishing thread; close the app and clients this target created."""
        if self._owns_app:
            closing = asyncio.get_running_loop().run_in_executor(self._executor, self.app.close)
            # Behind a publish that never returned this would wait forever: bounded.
            await asyncio.wait({closing}, timeout=self.timeout)
        self._executor.shutdown(wait=False)
        for client in self._owned_clients:
            await client.aclose()
