"""The aiohttp side of the bounded HTTPS listeners: the listener, its TLS protocol, the middleware.

Neighbours: `webhook.connections` decides (the phases, deadlines and evictions its
module doc tells, over `Tracked` connections); here `TlsSite` listens through
`webhook.accepting.Listener`, admits each accepted connection with `Connections.room`, and
serves it with `_TlsConnection`, asyncio's TLS protocol reading into 32 KiB (not 256 KiB)
and handing the connection to aiohttp once the handshake is done; `track` is the
middleware `webhook.server` and `webhook.metricsserver` put in their apps, and `HTTP_LOG`
the logger of their aiohttp servers. `commands.serve` starts the webhook's and the
metrics' listeners as `TlsSite`s.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import ssl
import struct
import termios
from asyncio.sslproto import SSLProtocol
from collections.abc import Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler, Middleware

from webhook.accepting import Listener
from webhook.connections import Connections, Phase

__all__ = ["HTTP_LOG", "TlsSite", "track", "unread"]

log = logging.getLogger(__name__)

# How long a connection whose request was refused unread (`Connections.hang_up`) lives on
# for its client to read the answer. Without it, aiohttp reads and discards the rest of
# the body for up to 10 s (its lingering close, which exists so that the client gets the
# answer and not a reset): 9 MiB reviews posted 4 at a time from a Pod took 93 % of
# `serve`'s CPU decrypting bytes nobody reads, an honest review's p99 115 ms
# (bench/attacks.py, "oversized"). The client's writes stall in the kernel meanwhile; a
# client reading its answer as it writes (Go's net/http does) has it at once.
ANSWER_GRACE = 1.0
# Draining, once the listener closed: how long a connection it accepted last may take to
# bring its request (the API server writes it right after the handshake).
DRAIN_OPENING_SECONDS = 2.0


def track(connections: Connections) -> Middleware:
    """The middleware telling `connections` when each request's handler starts and ends."""

    @web.middleware
    async def tracked(request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = connections.of(request.protocol)
        if conn is None:
            return await handler(request)
        connections.enter(conn, Phase.REQUEST)
        try:
            response = await handler(request)
            if connections.draining and not response.prepared:
                response.force_close()  # `Connection: close` (`Connections.drain`)
            return response
        finally:
            connections.enter(conn, Phase.IDLE)

    return tracked


class _ClientErrors(logging.Filter):
    """Keeps aiohttp's records of malformed HTTP out of the log.

    aiohttp answers a request it cannot parse with 400 and logs it at ERROR with a
    traceback: any client that reaches the port could fill the logs with them. The
    client got its answer; nothing here is ours to fix (our handlers never raise).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], HttpProcessingError):
            log.debug("malformed HTTP from a client: %s", record.exc_info[1])
            return False
        return True


# The logger of the listeners' aiohttp servers (`web.AppRunner(..., logger=HTTP_LOG)`).
HTTP_LOG = logging.getLogger("webhook.http")
HTTP_LOG.addFilter(_ClientErrors())


class _TlsConnection(SSLProtocol):
    """asyncio's server-side TLS protocol, reading into 32 KiB, reporting to `Connections`.

    aiohttp's handler is made only once the TLS handshake is done (`_Handshaking`): a
    connection dropped before that costs no HTTP parser, and leaves no reference cycle
    for the garbage collector (a flood of them made its full collections the longest
    event loop stalls).

    asyncio.sslproto is not public API: this relies on SSLProtocol's constructor and its
    `max_size` read buffer as they are since Python 3.11 (the rewrite that made it a
    BufferedProtocol; unchanged through 3.13), and is run over real sockets by
    tests/unit/webhook/test_connections.py and test_transport.py.
    """

    # asyncio allocates (and zeroes) this much per connection at accept: 256 KiB by
    # default. Two full TLS records (16 KiB each) is enough to read a review quickly.
    max_size = 32 * 1024

    def __init__(self, loop: asyncio.AbstractEventLoop, handler: Callable[[], asyncio.BaseProtocol],
                 context: ssl.SSLContext, connections: Connections) -> None:
        # No waiter (typeshed wants a Future: one would hold every failed handshake's
        # exception, logged as never retrieved); seconds may be a float (asyncio's own use).
        super().__init__(loop, _Handshaking(self), context, None, server_side=True,  # type: ignore[arg-type]
                         ssl_handshake_timeout=connections.limits.tls_handshake_timeout)  # type: ignore[arg-type]
        self._connections = connections
        self._make_handler = handler
        self._handler: asyncio.BaseProtocol | None = None
        self._raw: asyncio.BaseTransport | None = None
        self._hung_up = False

    def handshaken(self, transport: asyncio.BaseTransport) -> None:
        """TLS is up: aiohttp's handler takes the connection over (public `set_protocol`)."""
        self._handler = self._make_handler()
        self._connections.handled(self, self._handler)
        transport.set_protocol(self._handler)
        self._handler.connection_made(transport)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Admitted at the accept (`TlsSite`); evicted since, before its transport was made?
        self._raw = transport
        if self._connections.phase(self) is None:
            transport.abort()  # type: ignore[attr-defined]  # a socket transport: no handshake at all
            return
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._connections.lost(self, self._handler)
        super().connection_lost(exc)
        # aiohttp's handler holds our app transport, which holds us: no cycle left behind.
        self._handler = None
        _unlink(self._raw)

    def buffer_updated(self, nbytes: int) -> None:
        # Bytes on an idle kept-alive connection start the next request: its headers
        # get `header_timeout`, not what is left of the idle timeout.
        if self._connections.phase(self) is Phase.IDLE:
            self._connections.enter(self, Phase.HEADERS)
        super().buffer_updated(nbytes)

    def waiting(self) -> bool:
        """The kernel holds bytes from the client that the loop has not read yet."""
        sock = self._raw.get_extra_info("socket") if self._raw is not None else None
        return sock is not None and unread(sock.fileno()) > 0

    def abort(self) -> None:
        if self._raw is not None:
            self._raw.abort()  # type: ignore[attr-defined]  # a socket transport

    def hang_up(self, ended: Callable[[], None]) -> None:
        """Read no more from the socket, and abort the connection `ANSWER_GRACE` seconds
        on, telling `ended` first: the answer is written meanwhile (writing does not wait
        on reading)."""
        if self._hung_up or self._raw is None or self._raw.is_closing():
            return
        self._hung_up = True
        self._raw.pause_reading()  # type: ignore[attr-defined]  # a socket transport

        def drop() -> None:
            ended()
            self.abort()

        self._loop.call_later(ANSWER_GRACE, drop)

    def _control_ssl_reading(self) -> None:
        # SSLProtocol resumes the socket's reading once its own buffer drains, when it was
        # the one to pause it (asyncio/sslproto.py, since 3.11): never after `hang_up`.
        if not self._hung_up:
            super()._control_ssl_reading()  # type: ignore[misc]  # asyncio's, untyped


class _Handshaking(asyncio.Protocol):
    """A TLS connection's app protocol until its handshake is done (asyncio calls nothing
    else on it before): then it hands the connection to aiohttp's handler."""

    def __init__(self, conn: _TlsConnection) -> None:
        self._conn = conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._conn.handshaken(transport)


def unread(fileno: int) -> int:
    """Bytes received on the socket `fileno` that nobody has read yet (FIONREAD); 0 once it is closed."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fileno, termios.FIONREAD, b"\0\0\0\0"))[0])
    except (OSError, ValueError):
        return 0


def _unlink(transport: asyncio.BaseTransport | None) -> None:
    """Break the reference cycle asyncio's socket transport makes with itself.

    `_SelectorSocketTransport` keeps its read callback as a bound method of itself
    (`_read_ready_cb`, CPython 3.11 to 3.13 asyncio/selector_events.py), so a closed
    transport, its socket and dicts wait for the cyclic collector: under a flood of
    connections each accepted and evicted, thousands a second, whose collections stalled
    the loop for up to 0.3 s. Called from the protocol's `connection_lost` (the reader is
    removed by then and nothing reads again), it lets reference counting free them at once.
    """
    if transport is not None and hasattr(transport, "_read_ready_cb"):
        transport._read_ready_cb = None


class TlsSite(web.BaseSite):
    """An HTTPS listener whose connections `connections` bounds (aiohttp's TCPSite, plus the bounds)."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, context: ssl.SSLContext,
                 connections: Connections, reuse_port: bool = False) -> None:
        super().__init__(runner, ssl_context=context)
        self._host, self._port, self._reuse_port = host, port, reuse_port
        self._context = context
        self.connections = connections
        self._sweeper: asyncio.Task[None] | None = None
        self._listening: Listener | None = None

    @property
    def name(self) -> str:
        return f"https://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        """The port listened on (the one chosen when `port` was 0)."""
        sockets = self._listening.sockets if self._listening is not None else ()
        return int(sockets[0].getsockname()[1]) if sockets else self._port

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None

        def admit(source: str) -> asyncio.BaseProtocol | None:
            """A new connection from `source`: room made for it, or refused (module doc)."""
            if not self.connections.room(source):
                return None
            conn = _TlsConnection(loop, server, self._context, self.connections)
            self.connections.opened(conn, source)
            return conn

        hosts = [h.strip() for h in self._host.split(",")]
        self._server = self._listening = await Listener.open(hosts, self._port, admit, reuse_port=self._reuse_port)
        self._sweeper = asyncio.create_task(self.connections.run(), name=f"connections {self.name}")

    async def stop(self) -> None:
        await super().stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
        # Connections with a request in flight are aiohttp's to finish (the runner's
        # shutdown_timeout); those no request reached yet are not aiohttp's at all. The
        # listener's last accepted ones (`Listener.close`) are the API server's, which
        # writes its review right after the handshake: while draining, they get a moment
        # to bring it.
        if self.connections.draining:
            await self.connections.opened_requests(DRAIN_OPENING_SECONDS)
        self.connections.close_opening()
