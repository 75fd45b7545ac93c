"""Idle and slow connections held against a listener, as a hostile tenant would hold them.

Shared by tests/e2e/test_connections.py (a few thousand) and bench/connections.py
(10,000). `count` workers each hold one connection of one kind, round-robin:

- tcp: connects and sends nothing (no TLS handshake at all);
- tls: completes the TLS handshake, then sends nothing;
- headers: handshakes, then trickles a request's headers one byte at a time (slowloris);
- body: handshakes, sends a POST's headers (Content-Length 1 MB), trickles the body.

When the server drops a connection the worker opens another after `reopen` seconds (an
attacker keeps the pressure on), until `stop` is set. TLS is done by hand over a raw
non-blocking socket (ssl.MemoryBIO), not with asyncio's TLS layer, whose 256 KiB buffer
per connection would cost this process 2.5 GB at 10,000; sockets close with SO_LINGER 0
(a reset, no TIME_WAIT), so re-opening cannot run out of loopback ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from dataclasses import dataclass, field

__all__ = ["KINDS", "Attack", "attack"]

KINDS = ("tcp", "tls", "headers", "body")
_HEADERS = b"POST /validate HTTP/1.1\r\nHost: dra-quota-webhook.dra-quota-system.svc\r\nX-Slow: " + b"a" * 4000
_BODY_HEAD = (b"POST /validate HTTP/1.1\r\nHost: dra-quota-webhook.dra-quota-system.svc\r\n"
              b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n")


@dataclass
class Attack:
    """What the attack achieved: connections opened, dropped by the server, open now, failed to open."""

    opened: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    failed: int = 0
    open: int = 0
    peak_open: int = 0

    def line(self) -> str:
        return (f"attack: {self.open} open now (peak {self.peak_open}), opened {sum(self.opened.values())} "
                f"{self.opened}, dropped by the server {sum(self.dropped.values())}, failed to open {self.failed}")


class _Conn:
    """A raw socket, TLS by hand when `context` is given."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext | None) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.tls: ssl.SSLObject | None = None
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        if context is not None:
            self.tls = context.wrap_bio(self._in, self._out, server_hostname="dra-quota-webhook.dra-quota-system.svc")

    async def handshake(self) -> None:
        assert self.tls is not None
        while True:
            try:
                self.tls.do_handshake()
                await self._flush()
                return
            except ssl.SSLWantReadError:
                await self._flush()
                data = await self.loop.sock_recv(self.sock, 16384)
                if not data:
                    raise ConnectionResetError("closed during the handshake")
                self._in.write(data)

    async def send(self, data: bytes) -> None:
        if self.tls is None:
            await self.loop.sock_sendall(self.sock, data)
            return
        self.tls.write(data)
        await self._flush()

    async def closed(self) -> None:
        """Return once the server closed the connection (whatever it sent before)."""
        while await self.loop.sock_recv(self.sock, 16384):
            pass

    async def _flush(self) -> None:
        if data := self._out.read():
            await self.loop.sock_sendall(self.sock, data)

    def close(self) -> None:
        self.sock.close()


async def _open(port: int, kind: str, context: ssl.SSLContext) -> _Conn:
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        conn = _Conn(sock, None if kind == "tcp" else context)
        if conn.tls is not None:
            await conn.handshake()
    except BaseException:
        sock.close()
        raise
    return conn


async def _hold(conn: _Conn, kind: str, trickle: float) -> None:
    """Hold `conn` as `kind` holds it until the server closes it."""
    closed = asyncio.ensure_future(conn.closed())
    try:
        data = {"headers": _HEADERS, "body": _BODY_HEAD + b" " * 1_000_000}.get(kind, b"")
        if kind == "body":
            await conn.send(_BODY_HEAD)
            data = data[len(_BODY_HEAD):]
        for i in range(len(data)):
            if closed.done():
                break
            await conn.send(data[i:i + 1])
            await asyncio.wait([closed], timeout=trickle)
        await closed
    finally:
        closed.cancel()


async def attack(port: int, count: int, stop: asyncio.Event, *, ramp: float = 1000.0, reopen: float = 2.0,
                 trickle: float = 1.0, report: Attack | None = None) -> Attack:
    """Hold `count` connections of the KINDS against 127.0.0.1:`port` until `stop`; opened at
    `ramp` a second, each re-opened `reopen` seconds after the server dropped it."""
    out = report or Attack()
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # an attacker verifies nothing

    async def worker(i: int) -> None:
        kind = KINDS[i % len(KINDS)]
        await asyncio.sleep(i / ramp)
        while not stop.is_set():
            try:
                conn = await asyncio.wait_for(_open(port, kind, context), timeout=30)
            except (OSError, ssl.SSLError, TimeoutError):
                out.failed += 1
            else:
                out.opened[kind] += 1
                out.open += 1
                out.peak_open = max(out.peak_open, out.open)
                try:
                    await _hold(conn, kind, trickle)
                    out.dropped[kind] += 1
                except (OSError, ssl.SSLError):
                    out.dropped[kind] += 1
                finally:
                    out.open -= 1
                    conn.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=reopen)

    workers = [asyncio.create_task(worker(i)) for i in range(count)]
    try:
        await stop.wait()
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    return out
