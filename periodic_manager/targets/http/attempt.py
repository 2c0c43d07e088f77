"""One attempt of a delivery: the request as it was stored, signed now, sent with a timeout and a
cap on the answer read; then what it came to (:func:`decide`): done on a 2xx; retried after a
backoff with jitter (or the receiver's ``Retry-After``, if longer) on 408, 429, 5xx and errors
of the connection; dead on any other answer, a redirect not followed, a refused address, or
once the policy's attempts or age are spent."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from periodic_manager.db.http_deliveries import DEAD, DONE, PENDING, Claimed, Outcome
from periodic_manager.errors import cause
from periodic_manager.schedules.instants import slot_text
from periodic_manager.targets.http.options import Retry
from periodic_manager.targets.http.signing import SIGNATURE_HEADER, secret_of, secret_variable, sign
from periodic_manager.version import __version__

RETRIED_STATUSES = (408, 429)
EXCERPT_CHARS = 1000
USER_AGENT = f"periodic-manager/{__version__}"


class Refused(Exception):
    """A request the target will not make (a private address): permanent."""


@dataclass(frozen=True, slots=True)
class Request:
    """A delivery's request and policy, as stored (``options.request_of``)."""

    url: str
    method: str
    headers: dict[str, str]
    secret: str | None
    timeout: float
    follow_redirects: bool
    retry: Retry

    @classmethod
    def parse(cls, text: str) -> Request:
        raw: dict[str, Any] = json.loads(text)
        return cls(
            url=raw["url"],
            method=raw["method"],
            headers=dict(raw.get("headers") or {}),
            secret=raw.get("secret"),
            timeout=float(raw["timeout"]),
            follow_redirects=bool(raw.get("follow_redirects")),
            retry=Retry(**raw["retry"]),
        )


@dataclass(frozen=True, slots=True)
class Answer:
    """What one request came to: a status (None: no answer), or why none."""

    status: int | None = None
    error: str | None = None
    body: str | None = None
    retry_after: float | None = None  # seconds the receiver asked to wait
    permanent: bool = False  # no retry can change it

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def headers_of(claimed: Claimed, request: Request, now: datetime) -> dict[str, str]:
    """The request's headers: the schedule's, then the target's (key, slot, signature)."""
    headers = dict(request.headers)
    headers.update(
        {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "Idempotency-Key": claimed.idempotency_key,
            "X-PM-Scheduled-At": slot_text(claimed.slot_at),
            "X-PM-Attempt": str(claimed.attempts + 1),
        }
    )
    if request.secret is not None:
        secret = secret_of(request.secret)
        if secret is None:
            raise LookupError(f"{secret_variable(request.secret)} is not set in this manager")
        headers[SIGNATURE_HEADER] = sign(secret, int(now.timestamp()), claimed.body.encode())
    return headers


async def attempt(
    client: httpx.AsyncClient, claimed: Claimed, request: Request, now: datetime, cap: int
) -> Answer:
    """Send ``claimed`` once (see the module doc); never raises for what the receiver does."""
    try:
        headers = headers_of(claimed, request, now)
    except LookupError as exc:  # the secret may be set on another manager, or later
        return Answer(error=str(exc))
    try:
        # The whole request within its timeout (httpx's bounds each read: a receiver trickling
        # a byte at a time would hold a per-host slot for days, past the row's lease).
        async with (
            asyncio.timeout(request.timeout),
            client.stream(
                request.method,
                request.url,
                content=claimed.body.encode(),
                headers=headers,
                timeout=request.timeout,
                follow_redirects=request.follow_redirects,
            ) as response,
        ):
            data = bytearray()
            async for chunk in response.aiter_raw():  # raw: no decompression of a bomb
                data += chunk
                if len(data) >= cap:
                    break
            return _answer(response, bytes(data[:cap]))
    except Refused as exc:
        return Answer(error=str(exc), permanent=True)
    except (httpx.TooManyRedirects, httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        return Answer(error=cause(exc), permanent=True)
    except (httpx.HTTPError, OSError) as exc:  # TimeoutError too: tried again
        return Answer(error=cause(exc))
    except Exception as exc:  # anything else the client raises: recorded, and tried again
        return Answer(error=f"unexpected {cause(exc)}")


def _answer(response: httpx.Response, data: bytes) -> Answer:
    status = response.status_code
    excerpt = data.decode("utf-8", "replace")[:EXCERPT_CHARS]
    if 200 <= status < 300:
        return Answer(status)
    if 300 <= status < 400:
        where = response.headers.get("location", "?")
        reason = f"redirect to {where[:200]} not followed (options.follow_redirects)"
        return Answer(status, reason, excerpt, permanent=True)
    if status in RETRIED_STATUSES or status >= 500:
        return Answer(status, f"HTTP {status}", excerpt, _retry_after(response))
    return Answer(status, f"HTTP {status}: a permanent answer", excerpt, permanent=True)


MAX_RETRY_AFTER_S = 366 * 86_400.0


def _retry_after(response: httpx.Response) -> float | None:
    """The receiver's ``Retry-After`` in seconds (a number, or a date read against its
    ``Date``), at most 366 days; None when absent or unreadable (the header is the receiver's:
    5,000 digits, a date without a zone or a bad ``Date`` must not fail the delivery)."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return min(_seconds_after(value.strip(), response.headers.get("date")), MAX_RETRY_AFTER_S)
    except (TypeError, ValueError, OverflowError):
        return None


def _seconds_after(value: str, date: str | None) -> float:
    if value.isascii() and value.isdigit():
        return float(int(value[:12]) if len(value) <= 12 else MAX_RETRY_AFTER_S)
    when = parsedate_to_datetime(value)
    base = parsedate_to_datetime(date) if date else None
    if base is None:
        raise ValueError("no clock of the receiver's to compare with; ours is not read here")
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    if base.tzinfo is None:
        base = base.replace(tzinfo=UTC)
    return max(0.0, (when - base).total_seconds())


def backoff(retry: Retry, attempts: int, rng: random.Random) -> float:
    """Seconds to wait after ``attempts`` failed ones: ``initial`` doubling up to ``max``, half
    of it random (jitter spreads a burst of retries)."""
    base = min(retry.max, retry.initial * 2.0 ** min(attempts - 1, 60))
    return base / 2 + rng.uniform(0, base / 2)


def decide(
    claimed: Claimed, request: Request, answer: Answer, now: datetime, rng: random.Random
) -> Outcome:
    """What the row becomes after ``answer`` (see the module doc)."""
    attempts = claimed.attempts + 1
    common: dict[str, Any] = {"id": claimed.id, "attempts": attempts, "at": now}
    common.update(status=answer.status, error=answer.error, body=answer.body)
    if answer.ok:
        return Outcome(state=DONE, **common)
    if answer.permanent:
        return Outcome(state=DEAD, **common)
    retry = request.retry
    if attempts >= retry.attempts:
        common["error"] = f"{answer.error}; gave up after {attempts} attempts"
        return Outcome(state=DEAD, **common)
    wait = max(backoff(retry, attempts, rng), answer.retry_after or 0.0)
    due = now + timedelta(seconds=wait)
    if due > claimed.created_at + timedelta(seconds=retry.max_age):
        common["error"] = f"{answer.error}; gave up: the next attempt would pass max_age"
        return Outcome(state=DEAD, **common)
    return Outcome(state=PENDING, next_attempt_at=due, **common)
