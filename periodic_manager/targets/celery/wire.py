"""Celery task messages as kombu's Redis transport stores them, written without kombu.

``app.send_task`` on a Redis broker ends in one ``LPUSH <list> <json>``: the list is the queue's
name (with kombu's ``global_keyprefix``; a message of priority ``p`` goes to ``<queue><sep><step>``
for the priority step ``p`` falls in, step 0 being the queue itself), and the JSON text is::

    {"body": <base64 of the JSON [args, kwargs, embed]>, "content-encoding": "utf-8",
     "content-type": "application/json", "headers": {<protocol 2 headers>},
     "properties": {"correlation_id", "reply_to", "delivery_mode", ["expiration"], "delivery_info":
                    {"exchange", "routing_key"}, "priority", "body_encoding": "base64",
                    "delivery_tag"}}

:class:`WireFormat` writes that text. Its headers come from the installed Celery itself: the
protocol-2 headers of a probe message (``app.amqp.as_task_v2``) give the keys, their order and the
constant values; only the fields a schedule decides are filled in per task. If a Celery version
stops producing one of those fields, :class:`WireFormat` refuses (and the target publishes through
kombu). :class:`Routes` resolves a task's destination with the app's own router, as send_task does.
"""

from __future__ import annotations

import base64
import json
import operator
import re
from bisect import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

# Headers filled per task; every other header of the probe message is a constant.
_PER_TASK = ("task", "id", "root_id", "expires", "timelimit", "argsrepr", "kwargsrepr")
# The manager's own headers, after Celery's (send_task's ``headers=`` are merged last).
_OURS = ("idempotency_key", "scheduled_at", "periodic_name")
# Route options the fast path understands; a route carrying anything else goes through kombu.
_ROUTE_KEYS = frozenset(
    {"queue", "exchange", "routing_key", "exchange_type", "priority", "delivery_mode"}
)
_DELIVERY_MODES = {"transient": 1, "persistent": 2}
# Every field of the message template, in the order WireFormat.envelope supplies them.
_FIELDS = (
    "body",
    "task",
    "id",
    "root_id",
    "expires",
    "timelimit",
    "argsrepr",
    "kwargsrepr",
    "idempotency_key",
    "scheduled_at",
    "periodic_name",
    "trace",
    "delivery_mode",
    "expiration",
    "exchange",
    "routing_key",
    "priority",
    "delivery_tag",
)
_PLACEHOLDER = re.compile(r"(?<!%)%\((\w+)\)([sd])")  # not after an escaped "%%"


class UnsupportedApp(Exception):
    """This app's messages cannot be written by :class:`WireFormat` (use kombu's path)."""


def _j(value: Any) -> str:
    """JSON text as kombu writes it (``json.dumps`` defaults: ASCII, ``", "`` and ``": "``)."""
    return json.dumps(value)


def _json_encoder() -> Any:
    """``json.dumps`` with its defaults, minus the per-call set-up of ``dumps`` (which outweighs
    the encoding of the small values of a message). JSON values only: no circular-reference
    check."""
    if c_make_encoder is None:  # pragma: no cover - CPython always has the C encoder
        return lambda value: json.dumps(value)
    encoder = c_make_encoder(
        None,
        json.JSONEncoder().default,
        encode_basestring_ascii,
        None,
        ": ",
        ", ",
        False,
        False,
        True,
    )
    return lambda value: "".join(encoder(value, 0))


def _depth_ok(value: Any, depth: int = 0) -> bool:
    """No container nested deeper than saferepr shows (it writes a 4th level as ``...``)."""
    if isinstance(value, list | tuple):
        return depth < 3 and all(_depth_ok(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return depth < 3 and all(_depth_ok(v, depth + 1) for v in value.values())
    return True


def fast_saferepr(value: Any, maxlen: int) -> str:
    """Celery's ``saferepr(value, maxlen)`` of a JSON value (argsrepr, kwargsrepr): ``repr`` when
    that is provably the same text, else Celery's function (a walk of the value in Python, kept
    for the values where the texts may differ).

    They differ only in strings (saferepr never escapes, and writes ``'`` as ``\\'``), in
    truncation (at ``maxlen``) and below the third level. A ``repr`` without ``"`` and without
    backslashes quoted every string with ``'`` and escaped nothing: the strings had no ``'``, no
    backslash and no unprintable character, so the texts agree.
    """
    text = repr(value)
    if (
        len(text) < maxlen
        and "\\" not in text
        and '"' not in text
        and (text.count("[") + text.count("{") < 4 or _depth_ok(value))
    ):
        return text
    from celery.utils.saferepr import saferepr

    return str(saferepr(value, maxlen))


# Compared and hashed by identity: a cached route is one object, hashed once per task cheaply.
@dataclass(frozen=True, slots=True, eq=False)
class Delivery:
    """Where send_task puts a message, for direct exchanges (the only ones written here).

    ``exchange`` is ``""`` (the default exchange, ``routing_key`` naming the queue: what Celery
    publishes to unless both an exchange and a routing key are given) or a direct exchange whose
    queues are looked up in kombu's binding set ``_kombu.binding.<exchange>`` at publish time.
    ``declare`` is the binding send_task declares first (set key, member), if any.
    """

    exchange: str
    routing_key: str
    queue_list: str  # the list for the default exchange ("" for a named exchange)
    binding_key: str  # kombu's binding set of a named exchange ("" for the default exchange)
    declare: tuple[str, str] | None
    priority: int
    priority_suffix: str  # "" or <sep><step>: appended to every list name
    delivery_mode: int


@dataclass(frozen=True, slots=True)
class Layout:
    """kombu's Redis key layout of an app (``broker_transport_options``)."""

    keyprefix: str
    sep: str
    priority_steps: tuple[int, ...]

    @classmethod
    def of(cls, app: Any) -> Layout:
        options = app.conf.broker_transport_options or {}
        if str(options.get("body_encoding", "base64")).lower() != "base64":
            raise UnsupportedApp("broker_transport_options.body_encoding is not base64")
        if options.get("deadletter_queue"):
            raise UnsupportedApp("broker_transport_options.deadletter_queue is set")
        steps = tuple(int(s) for s in options.get("priority_steps", (0, 3, 6, 9)))
        if not steps:
            raise UnsupportedApp("broker_transport_options.priority_steps is empty")
        return cls(
            str(options.get("global_keyprefix", "")), str(options.get("sep", "\x06\x16")), steps
        )

    def priority_suffix(self, priority: int) -> str:
        """kombu's list suffix for a message priority (clamped to 0-9, then its step)."""
        clamped = max(min(int(priority), 9), 0)
        step = self.priority_steps[bisect(self.priority_steps, clamped) - 1]
        return f"{self.sep}{step}" if step else ""

    def binding_key(self, exchange: str) -> str:
        return f"{self.keyprefix}_kombu.binding.{exchange}"


class Routes:
    """A task's :class:`Delivery`, resolved with the app's router (``task_routes``, ``task_queues``,
    ``task_default_queue``/``exchange``/``routing_key``) the way send_task resolves it.

    ``resolve`` returns None when the message would leave the direct-exchange case (a topic or
    fanout exchange, a broadcast queue, extra bindings, route options other than queue, exchange,
    routing key, exchange type, priority and delivery mode): kombu publishes those. Results are
    cached per (task name, options) when every router is a plain mapping (they ignore the
    arguments); a router function is asked for every task, as send_task asks it.
    """

    def __init__(self, app: Any, layout: Layout) -> None:
        from celery.app.routes import MapRoute
        from kombu import Exchange, Queue

        self._layout = layout
        self._router = app.amqp.router
        self._by_name_only = all(isinstance(r, MapRoute) for r in app.amqp.routes)
        self._default_mode = app.conf.task_default_delivery_mode
        self._exchange_cls = Exchange
        self._queue_cls = Queue
        # Exchanges the app declares with another type: kombu would treat them as such.
        self._not_direct = {
            q.exchange.name
            for q in app.amqp.queues.values()
            if q.exchange is not None and q.exchange.type != "direct"
        }
        self._cache: dict[tuple[Any, ...], Delivery | None] = {}

    def resolve(self, msg: Mapping[str, Any]) -> Delivery | None:
        """The delivery of the send_task call ``msg`` (see ``celery_message``);
        raises what Celery's router raises (QueueNotFound when missing queues are not created)."""
        get = msg.get
        key = (msg["name"], get("queue"), get("exchange"), get("routing_key"), get("priority"))
        if self._by_name_only:
            try:
                return self._cache[key]
            except KeyError:
                pass
        opts = {k: msg[k] for k in ("queue", "exchange", "routing_key", "priority") if k in msg}
        routed = self._router.route(dict(opts), msg["name"], msg["args"], msg["kwargs"])
        delivery = self._delivery(dict(routed))
        if self._by_name_only and len(self._cache) < 10_000:  # task types x options: bounded
            self._cache[key] = delivery
        return delivery

    def _delivery(self, routed: dict[str, Any]) -> Delivery | None:
        if not routed.keys() <= _ROUTE_KEYS:
            return None
        queue: Any = routed.get("queue")  # a kombu Queue (checked below)
        if type(queue) is not self._queue_cls or queue.bindings:
            return None  # a Broadcast or custom queue, or extra bindings: kombu's business
        qx = queue.exchange
        if qx is not None and qx.name and qx.type != "direct":
            return None
        exchange, routing_key = routed.get("exchange"), routed.get("routing_key")
        exchange_type = routed.get("exchange_type") or (qx.type if qx is not None else "direct")
        if exchange_type != "direct":
            return None
        layout = self._layout
        priority = routed.get("priority") or 0
        if isinstance(priority, bool) or not isinstance(priority, int):
            return None
        mode = (
            routed.get("delivery_mode")
            or (qx.delivery_mode if qx is not None else None)
            or self._default_mode
        )
        mode = _DELIVERY_MODES.get(mode, mode) if mode else 2
        if not isinstance(mode, int):
            return None
        declare = None
        if not queue.no_declare and qx is not None and qx.name:
            member = f"{queue.routing_key or ''}{layout.sep}{layout.sep}{queue.name}"
            declare = (layout.binding_key(qx.name), member)
        suffix = layout.priority_suffix(priority)
        if not exchange or not routing_key:
            # send_task's rule: no exchange or no routing key on a direct exchange -> the default
            # exchange, routing key = the queue's name.
            return Delivery(
                "",
                queue.name,
                f"{layout.keyprefix}{queue.name}{suffix}",
                "",
                declare,
                priority,
                suffix,
                mode,
            )
        if isinstance(exchange, self._exchange_cls):
            if exchange.type != "direct":
                return None
            exchange = exchange.name
        if (
            not isinstance(exchange, str)
            or not isinstance(routing_key, str)
            or exchange in self._not_direct
        ):
            return None
        return Delivery(
            exchange, routing_key, "", layout.binding_key(exchange), declare, priority, suffix, mode
        )


def _trace(headers: Mapping[str, Any]) -> str:
    """The ``traceparent`` header after the manager's own (``PM_OTEL``), as send_task merges it."""
    tp = headers.get("traceparent")
    return "" if tp is None else f', "traceparent": {encode_basestring_ascii(tp)}'


class WireFormat:
    """Writes the JSON text of one task message, as kombu would LPUSH it for ``app.send_task``
    (JSON serializer, protocol 2, base64 body). Raises UnsupportedApp if the app's Celery builds
    headers this class does not know."""

    def __init__(self, app: Any) -> None:
        probe = app.amqp.as_task_v2(
            "\x00id", "\x00name", (), {}, expires=None, time_limit=None, soft_time_limit=None
        )
        headers: Mapping[str, Any] = probe.headers
        missing = [k for k in _PER_TASK if k not in headers]
        if (
            missing
            or any(k in headers for k in _OURS)
            or set(probe.properties) != {"correlation_id", "reply_to"}
        ):
            raise UnsupportedApp(f"Celery's message headers changed (missing: {missing})")
        parts = []
        for key, value in headers.items():
            placeholder = f"%({key})s" if key in _PER_TASK else _j(value).replace("%", "%%")
            parts.append(f"{_j(key)}: {placeholder}")
        parts.extend(f"{_j(key)}: %({key})s" for key in _OURS)
        reply_to = _j(app.thread_oid).replace("%", "%%")
        named = (
            '{"body": "%(body)s", "content-encoding": "utf-8", "content-type": "application/json", '
            '"headers": {' + ", ".join(parts) + "%(trace)s"
            '}, "properties": {"correlation_id": %(id)s, '
            '"reply_to": ' + reply_to + ', "delivery_mode": %(delivery_mode)d%(expiration)s, '
            '"delivery_info": {"exchange": %(exchange)s, "routing_key": %(routing_key)s}, '
            '"priority": %(priority)d, "body_encoding": "base64", '
            '"delivery_tag": "%(delivery_tag)s"}}'
        )
        # Positional formatting of a tuple, cheaper per message than named formatting of a dict:
        # the template's fields, in the order Celery's headers put them, picked from _FIELDS order.
        order = [_FIELDS.index(m.group(1)) for m in _PLACEHOLDER.finditer(named)]
        self._template = _PLACEHOLDER.sub(r"%\2", named)
        self._pick = operator.itemgetter(*order)
        self._embed = probe.body[2]
        self._timezone = app.timezone
        self._repr_max = (app.amqp.argsrepr_maxsize, app.amqp.kwargsrepr_maxsize)
        self._encode = _json_encoder()
        self._last_slot = ("", "")

    def envelope(
        self,
        msg: Mapping[str, Any],
        delivery: Delivery,
        now: datetime,
        delivery_tag: str,
    ) -> str:
        """The message of the send_task call ``msg`` (see ``celery_message``), sent at ``now``."""
        args: Sequence[Any] = msg["args"] or ()  # send_task's `args or ()`: no arguments are ()
        kwargs = msg["kwargs"]
        body = self._encode([args, kwargs, self._embed]).encode()
        expires = msg.get("expires")
        if expires is None:
            expires_text, expiration = "null", ""
        else:
            at = (now + timedelta(seconds=expires)).astimezone(self._timezone)
            expires_text = f'"{at.isoformat()}"'
            expiration = f', "expiration": "{int(expires * 1000)}"'
        limits = (msg.get("time_limit"), msg.get("soft_time_limit"))
        task_id = encode_basestring_ascii(msg["task_id"])
        headers = msg["headers"]
        scheduled_at = headers["scheduled_at"]
        if scheduled_at != self._last_slot[0]:  # a burst shares its slot: escaped once
            self._last_slot = (scheduled_at, encode_basestring_ascii(scheduled_at))
        return self._template % self._pick(
            (
                base64.b64encode(body).decode(),
                encode_basestring_ascii(msg["name"]),
                task_id,
                task_id,  # root_id
                expires_text,
                "[null, null]" if limits == (None, None) else self._encode(list(limits)),
                encode_basestring_ascii(fast_saferepr(args, self._repr_max[0])),
                encode_basestring_ascii(fast_saferepr(kwargs, self._repr_max[1])),
                encode_basestring_ascii(headers["idempotency_key"]),
                self._last_slot[1],
                encode_basestring_ascii(headers["periodic_name"]),
                _trace(headers),
                delivery.delivery_mode,
                expiration,
                encode_basestring_ascii(delivery.exchange),
                encode_basestring_ascii(delivery.routing_key),
                delivery.priority,
                delivery_tag,
            )
        )
