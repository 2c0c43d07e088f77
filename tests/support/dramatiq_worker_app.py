"""Actors for a real Dramatiq worker in the tests: ``dramatiq tests.support.dramatiq_worker_app``
loads this module, which sets the broker the test names.

``PM_TEST_DRAMATIQ_URL``: the broker (a ``redis://`` URL: a RedisBroker in the namespace
``PM_TEST_DRAMATIQ_NAMESPACE``; an ``amqp://`` URL: a RabbitmqBroker). ``PM_TEST_DRAMATIQ_QUEUE``:
the queue of both actors. Each actor records what it received (arguments, message id, queue,
options) as a JSON line in the Redis list ``PM_TEST_OUT`` on ``PM_TEST_REDIS``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import dramatiq
import redis
from dramatiq.middleware import CurrentMessage

URL = os.environ.get("PM_TEST_DRAMATIQ_URL", "redis://127.0.0.1:6379/15")
REDIS = os.environ.get("PM_TEST_REDIS", "redis://127.0.0.1:6379/15")
OUT = os.environ.get("PM_TEST_OUT", "pmtest:dramatiq:out")
QUEUE = os.environ.get("PM_TEST_DRAMATIQ_QUEUE", "default")

broker: Any
if URL.startswith("amqp"):
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker = RabbitmqBroker(url=URL)
else:
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(
        url=URL, namespace=os.environ.get("PM_TEST_DRAMATIQ_NAMESPACE", "dramatiq")
    )
broker.add_middleware(CurrentMessage())
dramatiq.set_broker(broker)


def _record(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    message = CurrentMessage.get_current_message()
    assert message is not None
    entry = {
        "actor": name,
        "args": list(args),
        "kwargs": kwargs,
        "id": message.message_id,
        "queue": message.queue_name,
        "options": {k: v for k, v in message.options.items() if k != "redis_message_id"},
    }
    client = redis.Redis.from_url(REDIS)
    try:
        client.rpush(OUT, json.dumps(entry))
    finally:
        client.close()


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def record(*args: Any, **kwargs: Any) -> None:
    _record("record", args, kwargs)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def other(*args: Any, **kwargs: Any) -> None:
    _record("other", args, kwargs)
