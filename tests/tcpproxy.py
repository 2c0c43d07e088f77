"""A loopback TCP proxy that a test can cut and restore (fault injection without root)."""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    """Forwards 127.0.0.1:<port> to an upstream; ``cut()`` refuses and drops every connection."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.frozen = False  # blackhole: connections stay open, bytes are dropped (half-open peer)

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
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

    async def close(self) -> None:
        await self.cut()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        a = asyncio.ensure_future(self._pipe(reader, up_writer, self))
        b = asyncio.ensure_future(self._pipe(up_reader, writer, self))
        self._pipes.update((a, b))
        try:
            await asyncio.gather(a, b, return_exceptions=True)
        finally:
            self._pipes.difference_update((a, b))
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proxy: TcpProxy) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(65536):
                if proxy.frozen:
                    continue
                writer.write(data)
                await writer.drain()
            # A frozen link does not pass a close on either: the far end keeps a half-open socket.
            while proxy.frozen:  # noqa: ASYNC110 - a test helper, polls its own flag
                await asyncio.sleep(0.05)
        with contextlib.suppress(Exception):
            writer.transport.abort()
