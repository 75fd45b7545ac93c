"""Listening sockets whose connections are accepted here, a few at a time, and refused
before anything is built for them.

Neighbours: `webhook.tlssite.TlsSite` listens through `Listener`; its `admit`
(`Connections.room`, then the TLS protocol) decides each accepted socket's fate from its
peer's address alone.

Why not asyncio's server (`loop.create_server`): per readiness event of the listening
socket it accepts up to `backlog` sockets and builds, for each, a task, a socket
transport and the protocol before anyone sees the peer's address, so even a connection
to be refused cost all of that (and our TLS protocol's zeroed 32 KiB buffer), and a
burst of hundreds of admitted ones ran their constructions in one loop iteration,
their TLS handshakes in the next. Under bench/connections.py's flood (10,000 idle and
slow connections from one Pod's address, each re-opened 5 s after it was dropped) that
was 1,400 accepts a second, each evicting one of the flood's own: serve's one event loop
spent most of its time there, in iterations of 20-250 ms, and an honest review, which
needs a few iterations, waited through several (p99 0.8-1.3 s).

Here a refused connection costs an accept and a reset (SO_LINGER 0: no TIME_WAIT left
here); per readiness event at most `ACCEPT_BATCH` are accepted and at most `ADMIT_BATCH`
of them admitted; the rest wait in the kernel's queue (`LISTEN_BACKLOG`) until the next
iteration, after the connections already open had their turn.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import struct
from collections.abc import Callable, Sequence

__all__ = ["ACCEPT_BATCH", "ADMIT_BATCH", "LISTEN_BACKLOG", "Admit", "Listener"]

log = logging.getLogger(__name__)

# The kernel queues this many connections not accepted yet (capped at
# net.core.somaxconn, 4096 by default: Go's net.Listen takes that too). aiohttp's 128
# overflowed during a flood, and a new API server connection then waited out SYN
# retransmissions (1 s, then 3 s).
LISTEN_BACKLOG = 4096
# Accepted, and admitted, per readiness event of one listening socket (module doc).
# asyncio accepts as many as listen()'s backlog: 4,096 there made stalls of seconds.
ACCEPT_BATCH = 128
ADMIT_BATCH = 8
# Out of descriptors or memory: accepting again at once would spin (asyncio's remedy).
PAUSE_SECONDS = 1.0
_SCARCE = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}

# Told a new connection's source (its peer's address): the protocol to serve it with, or
# None to refuse it.
Admit = Callable[[str], asyncio.BaseProtocol | None]


class Listener(asyncio.AbstractServer):
    """Listening sockets accepted from by `_ready`, connections admitted by `admit` (module doc)."""

    def __init__(self, sockets: Sequence[socket.socket], admit: Admit) -> None:
        self._loop = asyncio.get_running_loop()
        self._sockets = list(sockets)
        self._admit = admit
        self._starting: set[asyncio.Task[None]] = set()
        for sock in self._sockets:
            self._loop.add_reader(sock.fileno(), self._ready, sock)

    @classmethod
    async def open(cls, hosts: str | Sequence[str], port: int, admit: Admit, *, reuse_port: bool = False) -> Listener:
        return cls(await _bound(hosts, port, reuse_port), admit)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._sockets)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return bool(self._sockets)

    def close(self) -> None:
        """Stop listening; connections already admitted are their protocols' to finish.

        The connections waiting in the kernel's queue are accepted first: closing a
        listening socket resets them, and with SO_REUSEPORT the kernel gives one
        listener of the group connections until the moment it closes (a replica leaving
        a shared port would fail the API server's calls on them). Accepting and closing
        run in one step of the loop, so only a handshake completing within it is lost.
        """
        for sock in self._sockets:
            self._loop.remove_reader(sock.fileno())
            self._accept_queued(sock)
            sock.close()
        self._sockets = []

    def _accept_queued(self, sock: socket.socket) -> None:
        for _ in range(LISTEN_BACKLOG):
            try:
                conn, address = sock.accept()
            except ConnectionAbortedError:
                continue
            except OSError:  # empty (BlockingIOError), or out of descriptors: nothing more to take
                return
            protocol = self._admit(_source(address))
            if protocol is None:
                _reset(conn)
            else:
                self._start(conn, protocol)

    async def wait_closed(self) -> None:
        if self._starting:
            await asyncio.gather(*self._starting, return_exceptions=True)

    def _ready(self, sock: socket.socket) -> None:
        admitted = 0
        for _ in range(ACCEPT_BATCH):
            try:
                conn, address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # reset by its client while it waited in the queue
            except OSError as err:
                if err.errno not in _SCARCE:
                    raise  # the loop logs it, as it does asyncio's own accept errors
                log.warning("accepting a connection failed (%s); accepting again in %gs", err, PAUSE_SECONDS)
                self._pause(sock)
                return
            protocol = self._admit(_source(address))
            if protocol is None:
                _reset(conn)
                continue
            self._start(conn, protocol)
            admitted += 1
            if admitted == ADMIT_BATCH:
                return

    def _start(self, conn: socket.socket, protocol: asyncio.BaseProtocol) -> None:
        """Give `conn` its transport (asyncio's, public: `connect_accepted_socket`)."""

        async def start() -> None:
            try:
                await self._loop.connect_accepted_socket(lambda: protocol, conn)
            except OSError as err:  # reset by its client before its transport was made
                # (its place in `Connections` goes at its header deadline)
                log.debug("a connection closed before it was served: %s", err)
                conn.close()
            except asyncio.CancelledError:  # the loop is closing
                conn.close()
                raise

        task = self._loop.create_task(start())
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    def _pause(self, sock: socket.socket) -> None:
        self._loop.remove_reader(sock.fileno())

        def resume() -> None:
            if sock in self._sockets:
                self._loop.add_reader(sock.fileno(), self._ready, sock)

        self._loop.call_later(PAUSE_SECONDS, resume)


def _source(address: object) -> str:
    """The peer's address from accept()'s (host, port, ...) tuple."""
    return str(address[0]) if isinstance(address, tuple) and address else ""


def _reset(conn: socket.socket) -> None:
    """Close `conn` with a reset: nothing of it lingers here (no FIN handshake, no TIME_WAIT)."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass  # already reset by its client
    conn.close()


async def _bound(hosts: str | Sequence[str], port: int, reuse_port: bool) -> list[socket.socket]:
    """Listening sockets on every address `hosts` resolve to ("": all of them), as
    asyncio's create_server binds them (IPv6 sockets IPv6 only), non-blocking."""
    loop = asyncio.get_running_loop()
    names = [hosts] if isinstance(hosts, str) else list(hosts)
    infos: set[tuple[int, int, int, tuple[object, ...]]] = set()
    for name in names:
        found = await loop.getaddrinfo(name or None, port, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        infos.update((family, kind, proto, tuple(address)) for family, kind, proto, _, address in found)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, address in infos:
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as err:
                raise OSError(err.errno, f"error while attempting to bind on address {address!r}: "
                                         f"{err.strerror.lower() if err.strerror else err}") from None
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets
