"""A loopback TCP proxy that a test can cut and restore (fault injection without root).

It also drops the reply to one request (:meth:`TcpProxy.drop_reply`: the server did the work,
the client never learns it) and runs an action when a request passes (:meth:`TcpProxy.on_request`:
kill the server just before or just after it). Requests are recognized by a marker in their
bytes (a script's SHA, a command name, a task id), enough for RESP and AMQP alike.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.support.servers import free_port


@dataclass
class _Rule:
    marker: bytes
    action: Callable[[], None] | None = None
    after: bool = False  # the action runs once the request was forwarded


@dataclass
class _Link:
    """One proxied connection: whether the reply now on its way back is to be dropped."""

    drop: bool = False
    writers: list[asyncio.StreamWriter] = field(default_factory=list)


class TcpProxy:
    """Forwards 127.0.0.1:<port> to an upstream; ``cut()`` refuses and drops every connection."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.frozen = False  # blackhole: connections stay open, bytes are dropped (half-open peer)
        self._rules: list[_Rule] = []
        self.dropped = 0  # replies dropped so far

    async def start(self) -> int:
        # A port of this process's block (servers.free_port): kept free while the proxy is cut.
        self.port = self.port or free_port()
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, reuse_address=True
        )
        return self.port

    async def cut(self) -> None:
        """Stop listening (new connections are refused) and abort every open connection."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def restore(self) -> None:
        await self.start()

    def freeze(self) -> None:
        """Keep every connection open but forward nothing: a peer that accepts and never answers."""
        self.frozen = True

    def thaw(self) -> None:
        self.frozen = False

    def drop_reply(self, marker: bytes) -> None:
        """The next request holding ``marker`` reaches the server; the connection is then aborted
        as the server's reply comes back, before the client gets a byte of it."""
        self._rules.append(_Rule(marker))

    def on_request(self, marker: bytes, action: Callable[[], None], *, after: bool = False) -> None:
        """Run ``action`` when the next request holding ``marker`` passes: before it is
        forwarded (the server never sees it), or ``after`` (the server got it; then no reply to
        it reaches the client: a server killed so may have answered before the kill landed)."""
        self._rules.append(_Rule(marker, action, after))

    def _match(self, data: bytes) -> _Rule | None:
        for rule in self._rules:
            if rule.marker in data:
                self._rules.remove(rule)
                return rule
        return None

    async def close(self) -> None:
        await self.cut()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        link = _Link(writers=[writer, up_writer])
        a = asyncio.ensure_future(self._pipe(reader, up_writer, self, link, upward=True))
        b = asyncio.ensure_future(self._pipe(up_reader, writer, self, link, upward=False))
        self._pipes.update((a, b))
        try:
            await asyncio.gather(a, b, return_exceptions=True)
        finally:
            self._pipes.difference_update((a, b))
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()

    @staticmethod
    async def _pipe(
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        proxy: TcpProxy,
        link: _Link,
        *,
        upward: bool,
    ) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(65536):
                if proxy.frozen:
                    continue
                rule = proxy._match(data) if upward and proxy._rules else None
                if rule is not None and rule.action is not None and not rule.after:
                    rule.action()
                if rule is not None and (rule.action is None or rule.after):
                    link.drop = True  # set before the server can answer
                if not upward and link.drop:
                    proxy.dropped += 1
                    for w in link.writers:  # the reply is lost: so is the connection
                        w.transport.abort()
                    return
                writer.write(data)
                await writer.drain()
                if rule is not None and rule.action is not None and rule.after:
                    rule.action()
            # A frozen link does not pass a close on either: the far end keeps a half-open socket.
            while proxy.frozen:  # noqa: ASYNC110 - a test helper, polls its own flag
                await asyncio.sleep(0.05)
        with contextlib.suppress(Exception):
            writer.transport.abort()
