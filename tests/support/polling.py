"""The one bounded poll of the tests: wait for something another process or connection does.

Slots are never waited for (tests drive a VirtualClock); what runs on the wall clock elsewhere (a
worker, a manager process, a server ending a session, a notification) is polled for, with a
deadline, and the wait fails with what was waited for.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

Check = Callable[[], bool | Awaitable[bool]]


async def eventually(
    check: Check,
    what: str,
    *,
    seconds: float = 20.0,
    interval: float = 0.05,
    detail: Callable[[], str] | None = None,
) -> None:
    """Poll ``check`` (a function returning a bool, or an awaitable of one) until it holds, for at
    most ``seconds`` of wall time; then fail naming ``what``, with ``detail()`` (a log) if given."""
    deadline = time.monotonic() + seconds
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            extra = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"not reached within {seconds} s: {what}{extra}")
        await asyncio.sleep(interval)
