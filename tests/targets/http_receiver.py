"""A real HTTP receiver for the http target's tests: an ASGI app served by uvicorn on 127.0.0.1.

It records every request, verifies signatures when given the secret, deduplicates by
Idempotency-Key (``processed`` counts each key it acted on: a key answered 2xx again is not
processed again), and answers as ``answer`` says (default 200). ``stop`` / ``start`` take it
down and up on the same port (a receiver outage). ``open_now`` / ``most_open``: requests being
answered at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Answer = tuple[int, dict[str, str], bytes]


@dataclass
class Receiver:
    answer: Callable[[Received], Awaitable[Answer] | Answer] = lambda r: (200, {}, b"ok")
    requests: list[Received] = field(default_factory=list)
    processed: Counter[str] = field(default_factory=Counter)
    answered_ok: Counter[str] = field(default_factory=Counter)  # 2xx answers per key
    open_keys: set[str] = field(default_factory=set)
    open_now: int = 0
    most_open: int = 0
    port: int = 0
    tls: tuple[str, str] | None = None  # certificate and key files: serve HTTPS
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/hook"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        got = Received(scope["method"], scope["path"], headers, body)
        self.requests.append(got)
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        self.open_keys.add(headers.get("idempotency-key", ""))
        try:
            answered = self.answer(got)
            if asyncio.iscoroutine(answered):
                answered = await answered
            status, extra, content = answered  # type: ignore[misc]
        finally:
            self.open_now -= 1
            self.open_keys.discard(headers.get("idempotency-key", ""))
        if 200 <= status < 300:
            key = headers.get("idempotency-key", "")
            self.answered_ok[key] += 1
            if key not in self.processed:  # deduplicates: a key is acted on once
                self.processed[key] += 1
        out = [(k.encode(), v.encode()) for k, v in extra.items()]
        out.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": content})

    async def start(self) -> None:
        if not self.port:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
        tls = {"ssl_certfile": self.tls[0], "ssl_keyfile": self.tls[1]} if self.tls else {}
        config = uvicorn.Config(
            self, host="127.0.0.1", port=self.port, log_level="error", lifespan="off", **tls
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.ensure_future(self._server.serve())
        for _ in range(500):
            if self._server.started:
                return
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)
        raise RuntimeError("the receiver did not start")

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self._task, 10)
        self._server = self._task = None
