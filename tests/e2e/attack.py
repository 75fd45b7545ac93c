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

`Attacker` runs the attack in a process of its own (`python -m tests.e2e.attack`), niced:
the caller's event loop then measures the server, not its own attack, and on a 2-core
machine the attack takes only the CPU left over, as a client on other hosts would.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import socket
import ssl
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["KINDS", "Attack", "Attacker", "attack"]

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


async def _open(host: str, port: int, kind: str, context: ssl.SSLContext) -> _Conn:
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    try:
        await loop.sock_connect(sock, (host, port))
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
                 trickle: float = 1.0, report: Attack | None = None, host: str = "127.0.0.1") -> Attack:
    """Hold `count` connections of the KINDS against `host`:`port` until `stop`; opened at
    `ramp` a second, each re-opened `reopen` seconds after the server dropped it. `host`
    ::1: the attack comes from another address than the API server (127.0.0.1), as a
    Pod's would."""
    out = report or Attack()
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # an attacker verifies nothing

    async def worker(i: int) -> None:
        kind = KINDS[i % len(KINDS)]
        await asyncio.sleep(i / ramp)
        while not stop.is_set():
            try:
                conn = await asyncio.wait_for(_open(host, port, kind, context), timeout=30)
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


# -- in a process of its own ----------------------------------------------------------------------


class Attacker:
    """`attack` in a child process; its report is a JSON file it rewrites every second (a
    pipe the reader stops draining would block the attacker)."""

    def __init__(self, port: int, connections: int, report: Path, *, ramp: float = 1000.0, reopen: float = 2.0,
                 nice: int = 19, host: str = "127.0.0.1") -> None:
        self.port, self.connections, self.path, self.host = port, connections, report, host
        self.ramp, self.reopen, self.nice = ramp, reopen, nice
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.e2e.attack", "--host", self.host, "--port", str(self.port),
            "--connections", str(self.connections),
            "--reopen", str(self.reopen), "--ramp", str(self.ramp), "--nice", str(self.nice),
            "--output", str(self.path), cwd=Path(__file__).resolve().parents[2])

    @property
    def report(self) -> dict[str, Any]:
        try:
            loaded: dict[str, Any] = json.loads(self.path.read_text())
        except (OSError, ValueError):  # not written yet
            return {}
        return loaded

    def opened(self) -> int:
        return sum(self.report.get("opened", {}).values())

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def stop(self) -> Attack:
        """SIGTERM (the attack's `stop`); what it achieved."""
        assert self.process is not None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), timeout=60)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        return Attack(**self.report) if self.report else Attack()


async def _attack_main(args: argparse.Namespace) -> None:
    """The attacking process: hold the connections, write the report to --output each second."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.nice(args.nice)
    stop, report = asyncio.Event(), Attack()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    task = asyncio.create_task(attack(args.port, args.connections, stop, ramp=args.ramp, reopen=args.reopen, host=args.host,
                                      report=report))

    def write() -> None:
        partial = args.output.with_suffix(".tmp")
        partial.write_text(json.dumps(report.__dict__))
        partial.replace(args.output)

    while not stop.is_set():
        write()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=1)
    await task
    write()


def main() -> None:
    parser = argparse.ArgumentParser(description="hold idle and slow connections against HOST:PORT")
    parser.add_argument("--host", default="127.0.0.1", help="127.0.0.1 or ::1 (loopback only)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--connections", type=int, required=True)
    parser.add_argument("--ramp", type=float, default=1000.0, help="connections opened a second")
    parser.add_argument("--reopen", type=float, default=2.0, help="seconds before a dropped one is re-opened")
    parser.add_argument("--nice", type=int, default=19, help="this process's niceness")
    parser.add_argument("--output", type=Path, required=True, help="the report, rewritten every second")
    asyncio.run(_attack_main(parser.parse_args()))


if __name__ == "__main__":
    main()
