"""The deliverer every manager runs beside its scheduler: it claims due deliveries of any
schedule (they belong to no partition: whichever manager is up delivers them), sends them paced
per host, and records what each came to.

One loop: write the outcomes gathered since the last turn (one transaction), claim due rows for
the hosts with room, start their requests, wait for an outcome, a new row or the poll interval.
A host has at most ``PM_HTTP_CONCURRENCY_PER_HOST`` requests open, and at most as many rows more
claimed waiting for one, so a burst of 10,000 slots to one receiver is 16 connections, not
10,000. A claim is a lease of twice the request's timeout plus a margin: a manager killed mid
request leaves rows another manager claims once it ends; the receiver sees again at most the
requests that were open, with the same Idempotency-Key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections import Counter
from datetime import datetime, timedelta

import httpx

from periodic_manager.contracts import Clock
from periodic_manager.db.http_deliveries import (
    DEAD,
    DONE,
    PENDING,
    Claimed,
    DeliveryStore,
    Outcome,
)
from periodic_manager.errors import cause
from periodic_manager.targets.http.addresses import refusal_of_resolved
from periodic_manager.targets.http.attempt import Answer, Refused, Request, attempt, decide
from periodic_manager.targets.http.config import HttpConfig
from periodic_manager.targets.http.options import Retry

log = logging.getLogger(__name__)

PRUNE_EVERY = timedelta(minutes=10)
# Rows claimed at most at once, over every host (a slow host holds at most twice its limit, so
# many slow receivers cannot keep the others waiting).
MAX_CLAIMED = 1024


class Deliverer:
    """Delivers the rows of ``store`` as ``owner`` (see the module doc)."""

    def __init__(
        self,
        store: DeliveryStore,
        config: HttpConfig,
        clock: Clock,
        owner: str,
        wake: asyncio.Event,
        counts: Counter[str] | None = None,
    ) -> None:
        self._store = store
        self._config = config
        self._clock = clock
        self._owner = owner
        self._wake = wake
        self._rng = random.Random()
        self._counts: Counter[str] = counts if counts is not None else Counter()
        self._per_host = config.concurrency_per_host
        self._gates: dict[str, asyncio.Semaphore] = {}
        self._claimed: Counter[str] = Counter()
        self._outcomes: list[Outcome] = []
        self._running: dict[int, asyncio.Task[None]] = {}
        self._started: set[int] = set()
        self._pruned_at: datetime | None = None

    async def run(self) -> None:
        """Deliver until cancelled; then give back the rows claimed and not sent yet."""
        async with self._client() as client:
            try:
                while True:
                    await self._turn(client)
            finally:
                await self._shutdown()

    async def _turn(self, client: httpx.AsyncClient) -> None:
        self._wake.clear()
        await self._flush()
        await self._prune()
        if await self._claim_some(client):
            return  # more may be due: claim again at once
        poll = self._clock.now() + timedelta(seconds=self._config.poll_interval)
        await self._clock.wait_until(self._wake, poll)

    async def _claim_some(self, client: httpx.AsyncClient) -> bool:
        """Claim due rows for the hosts with room and start them; True when a claim came back
        full (more may be due). A host with ``per_host`` rows claimed has no room: a claim takes
        at most ``per_host`` rows, so no host ever has more than twice that many claimed (those
        open and as many waiting), and no claimed row waits past its lease."""
        room = min(self._room(), self._per_host)
        if room <= 0:
            return False
        busy = {h for h, n in self._claimed.items() if n >= self._per_host}
        try:
            claimed = await self._store.claim(
                self._owner, self._clock.now(), room, self._lease, busy
            )
        except Exception as exc:  # the database is down: try again next turn
            log.warning("http deliveries: cannot claim (will retry): %s", cause(exc))
            return False
        # Attempts whose outcome is not written yet (the database failed the write, or the lease
        # ran out first): their row is claimed again, but sent again only by what is written.
        unwritten = {o.id for o in self._outcomes}
        for row in claimed:
            if row.id in self._running:  # its lease ran out while its request is open: ours still
                continue
            if row.id in unwritten:
                continue
            self._claimed[row.host] += 1
            self._running[row.id] = asyncio.ensure_future(self._deliver(client, row))
        return len(claimed) == room

    async def _prune(self) -> None:
        """Every PRUNE_EVERY, delete the done deliveries older than ``done_retention`` (any
        manager may: a row deleted twice is deleted once)."""
        now = self._clock.now()
        if self._pruned_at is not None and now - self._pruned_at < PRUNE_EVERY:
            return
        self._pruned_at = now
        try:
            gone = await self._store.prune(now - timedelta(seconds=self._config.done_retention))
        except Exception as exc:  # next time
            log.warning("http deliveries: cannot prune: %s", cause(exc))
            return
        if gone:
            log.info("http deliveries: %d done deliveries pruned", gone)

    def _room(self) -> int:
        """How many rows to claim now: enough to keep every host's requests busy, bounded."""
        return max(0, MAX_CLAIMED - len(self._running))

    def _lease(self, request: str) -> timedelta:
        try:
            timeout = Request.parse(request).timeout
        except (ValueError, KeyError, TypeError):
            timeout = 10.0
        return timedelta(seconds=2 * timeout + self._config.lease_margin)

    async def _deliver(self, client: httpx.AsyncClient, row: Claimed) -> None:
        gate = self._gates.setdefault(row.host, asyncio.Semaphore(self._per_host))
        try:
            try:
                request = Request.parse(row.request)
            except (ValueError, KeyError, TypeError) as exc:
                bad = Answer(error=f"unreadable request: {exc}", permanent=True)
                self._done(decide(row, _NO_RETRY, bad, self._clock.now(), self._rng))
                return
            async with gate:
                self._started.add(row.id)
                answer = await attempt(
                    client, row, request, self._clock.now(), self._config.max_response_bytes
                )
            self._done(decide(row, request, answer, self._clock.now(), self._rng))
        finally:
            self._claimed[row.host] -= 1
            if self._claimed[row.host] <= 0:
                del self._claimed[row.host]
            self._running.pop(row.id, None)
            self._started.discard(row.id)

    def _done(self, outcome: Outcome) -> None:
        self._outcomes.append(outcome)
        self._wake.set()

    async def _flush(self) -> None:
        if not self._outcomes:
            return
        outcomes, self._outcomes = self._outcomes, []
        try:
            await self._store.record(self._owner, outcomes)
        except BaseException as exc:
            # Kept for the next turn (or the stop's last flush, when cancelled: written once,
            # since a write applies only to rows still pending under this owner's lease).
            self._outcomes = outcomes + self._outcomes
            if not isinstance(exc, Exception):
                raise
            log.warning("http deliveries: cannot record %d outcomes: %s", len(outcomes), cause(exc))
            await self._clock.sleep(min(1.0, self._config.poll_interval))
            return
        self._counts.update(_COUNTED[o.state] for o in outcomes)

    async def _shutdown(self) -> None:
        unsent = [i for i in self._running if i not in self._started]
        for task in self._running.values():
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._flush()
            await self._store.release(self._owner, unsent)

    def _client(self) -> httpx.AsyncClient:
        verify: ssl.SSLContext | bool = True
        if self._config.ca_bundle:
            verify = ssl.create_default_context(cafile=self._config.ca_bundle)
        hooks = {} if self._config.allow_private else {"request": [_refuse_private]}
        return httpx.AsyncClient(
            verify=verify,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            event_hooks=hooks,
            trust_env=False,
        )


async def _refuse_private(request: httpx.Request) -> None:
    """Every request (redirects too) to a host that is, or resolves to, a private address is
    refused (addresses.py)."""
    why = await refusal_of_resolved(request.url.host, request.url.port or _port(request.url))
    if why is not None:
        raise Refused(f"{why}: refused (PM_HTTP_ALLOW_PRIVATE)")


def _port(url: httpx.URL) -> int:
    return 443 if url.scheme == "https" else 80


_COUNTED = {DONE: "done", PENDING: "retried", DEAD: "dead"}
# The policy of a row whose request cannot be read: no retry makes it readable.
_NO_RETRY = Request("", "POST", {}, None, 1.0, False, Retry(attempts=1))
