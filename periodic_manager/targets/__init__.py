"""Targets: where the tasks of due slots go, each claimed once per idempotency key.

``base`` holds what every target shares; ``redis/`` the Redis Streams target and the Redis
helpers (claims, previous tasks, sentinels, scripts, error translation); ``celery/`` the Celery
target; ``arq``, ``outbox``, ``memory`` and ``routing`` one target each.
"""
