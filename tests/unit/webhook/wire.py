"""Real sockets for the transport tests: the webhook app on loopback behind `TlsSite`, and a
client that writes HTTP by hand, in as many pieces and as slowly as a test asks.

aiohttp's client always sends a request whole and well formed; the API server's requests
arrive cut by TCP and TLS wherever the network cuts them, and a hostile client's
arrive however it likes. `Wire` is that client: raw bytes over TLS (or plain TCP, for
a client that never handshakes), the answer read back and parsed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from aiohttp import web

from certs.authority import service_names
from certs.rotation import Material, Policy, plan
from certs.tls import server_context
from webhook.connections import Connections, Limits
from webhook.server import Endpoint, build_app
from webhook.tlssite import HTTP_LOG, TlsSite


def mint() -> Material:
    minted = plan(None, Policy(dns_names=service_names("dra-quota", "ns"), ip_addresses=("127.0.0.1",)),
                  now=datetime.now(timezone.utc), trusted=frozenset())
    assert minted is not None
    return minted.material


MATERIAL = mint()


def client_context() -> ssl.SSLContext:
    return ssl.create_default_context(cadata=MATERIAL.bundle[0].decode())


@dataclass
class Served:
    port: int
    connections: Connections


@contextlib.asynccontextmanager
async def serving(endpoints: Mapping[str, Endpoint], *, limits: Limits = Limits(), max_body_bytes: int = 64 * 1024,
                  clock: Callable[[], float] = time.monotonic) -> AsyncIterator[Served]:
    """The webhook app as `serve` runs it (build_app with its connections, behind TlsSite);
    `clock`: what the connection deadlines are measured on."""
    connections = Connections(limits, clock=clock)
    app = build_app(endpoints, ready=lambda: True, max_body_bytes=max_body_bytes, connections=connections)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1, logger=HTTP_LOG)
    await runner.setup()
    site = TlsSite(runner, "127.0.0.1", 0, context=server_context(MATERIAL.serving), connections=connections)
    await site.start()
    try:
        yield Served(site.port, connections)
    finally:
        await runner.cleanup()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def review(self) -> Any:
        return json.loads(self.body)["response"]


class Wire:
    """One raw connection to `port`: TLS unless `tls` is False."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, *, tls: bool = True) -> Wire:
        if tls:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(),
                                                          server_hostname="dra-quota.ns.svc")
        else:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, data: bytes, *, pieces: int = 1, pause: float = 0.0) -> None:
        """`data` in `pieces` writes, each flushed and followed by `pause` seconds (a slow client)."""
        size = max(1, -(-len(data) // pieces))
        for start in range(0, len(data), size):
            self.writer.write(data[start:start + size])
            await self.writer.drain()
            if pause:
                await asyncio.sleep(pause)

    async def answer(self) -> Answer:
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}
        body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return Answer(int(status_line.split()[1]), headers, body)

    async def closed_by_server(self) -> bool:
        """True once the server closed the connection (EOF or reset), whatever it sent before."""
        try:
            while await self.reader.read(65536):
                pass
        except (ConnectionError, ssl.SSLError):
            pass
        return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await self.writer.wait_closed()


async def exchange(port: int, data: bytes, *, pieces: int = 1, pause: float = 0.0) -> Answer:
    """Send `data` on a new TLS connection (`Wire.send`'s pieces and pauses); the answer."""
    wire = await Wire.open(port)
    try:
        await wire.send(data, pieces=pieces, pause=pause)
        return await wire.answer()
    finally:
        await wire.close()


def post(body: bytes, *, path: str = "/validate", chunked: bool = False, length: int | None = None) -> bytes:
    """An HTTP/1.1 POST of `body` as the API server sends it (Content-Length), or chunked;
    `length` declares another Content-Length than the body's."""
    head = f"POST {path}?timeout=5s HTTP/1.1\r\nHost: dra-quota.ns.svc\r\nContent-Type: application/json\r\n"
    if chunked:
        size = 1000  # several chunks whatever the body
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size])
                          for i in range(0, len(body), size))
        return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + chunks + b"0\r\n\r\n"
    return (head + f"Content-Length: {len(body) if length is None else length}\r\n\r\n").encode() + body
