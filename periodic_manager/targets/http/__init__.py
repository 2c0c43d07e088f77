"""The ``http`` target: each slot one signed HTTP request to a receiver, delivered for sure.

A slot becomes a row of ``pm_http_deliveries`` (``target.py``, through
``db/http_deliveries.py``), unique on its idempotency key, in the manager's database: sending is
durable and quick, and a slot is one delivery whatever the managers and restarts. Every
manager's deliverer (``deliverer.py``) claims due rows with a lease, sends them, paced per host,
and records the outcome (``attempt.py``): done on a 2xx, retried with backoff and jitter on 408,
429, 5xx and connection errors, dead (a dead letter) on any other answer or once its attempts or
its age are spent. What a schedule may ask (``options.url``, ``method``, ``headers``,
``secret``, ``retry``, ``timeout``, ``follow_redirects``) and the write-time rule are in
``options.py``; the signature in ``signing.py``; which addresses are refused in ``addresses.py``.
"""
