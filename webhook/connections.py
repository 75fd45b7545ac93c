"""The HTTPS listeners' connections: how many, and how long each may take in every phase.

Neighbours: `commands.serve` starts the webhook's and the metrics' listeners as `TlsSite`s,
each with its own `Connections`, listening through `webhook.accepting.Listener`;
`webhook.server` and `webhook.metricsserver` build their apps with `track` (the
middleware that tells it when a request starts and ends) and call
`Connections.deciding` once a request has arrived whole. `add_arguments`/`from_args` are
the `dra-quota serve` flags.

Why: asyncio's TLS layer allocates a 256 KiB read buffer for every accepted connection
before its handshake, and neither asyncio nor aiohttp caps connections or times out a
handshake's wait for the first request, a slow request or an idle keep-alive: 3,000 idle
connections took `serve` from 117 MB to 1 GB (bench/connections.py). Here the TLS layer reads into
32 KiB (two full TLS records), and each connection is in one phase at a time, with its
own deadline, checked every second:

- opening: accepted, until its first request's headers are in: `header_timeout` from
  the accept (the TLS handshake alone also gets `tls_handshake_timeout`, asyncio's timer);
- headers: bytes of a later request arriving on a kept-alive connection: `header_timeout`;
- request: its handler runs (reading the body, or authorizing a scrape): `body_timeout`;
- deciding: the whole review arrived and is being decided: no deadline here (the
  review's own, from the API server's `timeout`, bounds it), and never evicted;
- idle: answered, nothing of the next request yet: `idle_timeout`, longer than the API
  server's 90 s idle timeout for its pooled webhook connections (client-go
  transport/cache.go: Go's http.Transport defaults), so the API server, not we, closes
  them: a request it writes on a connection we are closing would fail.

At `max_connections`, a new connection evicts the one that is worth least: the oldest
opening one, else the oldest in headers, then in request, then the least recently used
idle one; only when every connection is deciding is the new one closed at once. So
connections that idle or trickle can hold memory only up to the cap and can never lock
the API server out: its own connections carry requests, so they are the last evicted.
A source address holding more than half the cap is a hog: among the first
`EVICTION_SCAN` in that order, its connections go first, so a Pod flooding the port
evicts its own, not the API server's (which comes from another address and pools a few
dozen at most). Without a hog (one source, or a flood spread over many) the order alone
decides, so no source is ever worse off for holding more. But a hog is given only
`HOG_NEW_PER_SECOND` new connections a second, at the cap or below it; the rest are
refused: each costs a protocol and a TLS handshake on the one event loop (at the cap an
eviction too), and a flood re-opening its connections as fast as they go
(bench/connections.py: 1,400 a second at the cap; below it, everything its deadlines
dropped, 900 at once every 10 s) took most of the loop's time, an honest review's p99
0.8-1.3 s. A connection is admitted (or refused) at the accept, from its peer's address,
before anything is built for it (`webhook.accepting`), so a refused one costs an accept
and a reset.

Within a source, eviction passes over a connection whose client has sent bytes we have
not read yet (the kernel holds them: `waiting`): its client keeps up and we are the slow
party. Under a flood of connects the oldest opening connection is replaced hundreds of
times a second, and after a stall of the loop the API server's own new connection, its
handshake or request sitting unread, was the oldest: evicted, its create failed with
"connection reset by peer" (a fresh clone's hostile-tenant e2e test). When every one
worth evicting is waiting, we are behind: the new connection is refused (closed at once)
and those in progress go on, unless a hog's is among them and the new one is no hog's:
the hog's goes.
A connection that idles or trickles has nothing unread between our reads, so it stays
first in line; the bound keeps an eviction's cost a few system calls whatever the flood.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import fcntl
import logging
import ssl
import struct
import termios
import time
from asyncio.sslproto import SSLProtocol
from collections import Counter, OrderedDict
from collections.abc import Callable
from itertools import islice
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler, Middleware

from webhook.accepting import Listener

__all__ = ["DROP_REASONS", "HTTP_LOG", "Connections", "Limits", "Phase", "TlsSite", "Tracked", "add_arguments",
           "from_args", "track", "unread"]

log = logging.getLogger(__name__)

# Every deadline is checked this often: a deadline holds to within a second.
SWEEP_SECONDS = 1.0
# How many connections with unread bytes one eviction passes over (module doc).
EVICTION_SCAN = 16
# How many new connections a second a hog is given; the rest are refused before anything
# is built for them (module doc, `webhook.accepting`).
HOG_NEW_PER_SECOND = 32.0
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


class Phase(enum.IntEnum):
    """A connection's phase; the order is the eviction order (lowest first)."""

    OPENING = 0
    HEADERS = 1
    REQUEST = 2
    IDLE = 3
    DECIDING = 4


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one listener (module doc); seconds, and connections open at once."""

    max_connections: int = 1000
    tls_handshake_timeout: float = 10.0
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    idle_timeout: float = 120.0

    def timeout(self, phase: Phase) -> float | None:
        return {Phase.OPENING: self.header_timeout, Phase.HEADERS: self.header_timeout,
                Phase.REQUEST: self.body_timeout, Phase.IDLE: self.idle_timeout}.get(phase)

    def problem(self) -> str | None:
        if self.max_connections < 1:
            return f"--max-connections must be at least 1, got {self.max_connections}"
        for flag, value in (("--tls-handshake-timeout", self.tls_handshake_timeout),
                            ("--request-header-timeout", self.header_timeout),
                            ("--request-body-timeout", self.body_timeout), ("--idle-timeout", self.idle_timeout)):
            if not value > 0:
                return f"{flag} must be positive, got {value}"
        return None


class Tracked(Protocol):
    """What `Connections` needs of a connection: a way to drop it at once, whether its
    client sent bytes we have not read yet, and a way to stop reading them (`hang_up`)."""

    def abort(self) -> None: ...

    def waiting(self) -> bool: ...

    def hang_up(self, ended: Callable[[], None]) -> None: ...


class Connections:
    """The connections of one listener by phase: admits, evicts and expires them.

    Each phase keeps its connections in the order they entered it, so the oldest (the
    next to expire, the first to evict) is the first: admitting, moving and expiring
    cost O(1) per connection, whatever the cap.
    """

    def __init__(self, limits: Limits, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._phases: dict[Phase, OrderedDict[Tracked, float]] = {p: OrderedDict() for p in Phase}
        self._phase: dict[Tracked, Phase] = {}
        self._by_handler: dict[object, Tracked] = {}
        # Each connection's source address, and how many each source holds (module doc).
        self._source: dict[Tracked, str] = {}
        self._held: Counter[str] = Counter()
        # Connections dropped by us, by why: evicted, refused, or the phase whose deadline passed.
        self.dropped: Counter[str] = Counter()
        # A token bucket: how many more new connections a hog may have now (one bucket: at
        # most one source holds more than half the cap).
        self._hog_budget, self._hog_budget_at = HOG_NEW_PER_SECOND, clock()
        self.draining = False

    def drain(self) -> None:
        """From now on every answer says `Connection: close` (`track`): shutdown has begun.

        The API server writes its next review on a kept-alive connection whenever it
        likes: one we close under it fails that call ("EOF", "broken pipe", "connection
        reset": under failurePolicy Fail a refused create). An answer that says
        `Connection: close` is the one clean end of an HTTP/1.1 connection, so each
        connection ends after its next answer, and those left when the listener closes
        (the grace period's end) are the few the API server did not use meanwhile. Idle
        ones are not closed earlier on a timer of our own: closing them a second after
        SIGTERM, when the API server still picks from them under load, failed 2 creates
        of 4,000 (a loaded machine's client notices a close late).
        """
        self.draining = True

    def __len__(self) -> int:
        return len(self._phase)

    def counts(self) -> dict[Phase, int]:
        return {phase: len(queue) for phase, queue in self._phases.items()}

    def room(self, source: str = "") -> bool:
        """Make room for one more connection from `source` (its peer's address), evicting one
        if at the cap; False: `source` is a hog past its budget, or every one is deciding, or
        the first in line all wait on us and none is a hog's (or `source` is the hog) (module doc)."""
        if self._hogging(source) and not self._hog_may_open():
            self.dropped["refused"] += 1
            return False
        while len(self) >= self.limits.max_connections:
            victim = self._victim(source)
            if victim is None:
                self.dropped["refused"] += 1
                return False
            self._drop(victim, "evicted")
        return True

    def opened(self, conn: Tracked, source: str = "") -> None:
        """`conn` was accepted from `source` (after `room`)."""
        self._enter(conn, Phase.OPENING)
        self._source[conn] = source
        self._held[source] += 1

    def handled(self, conn: Tracked, handler: object) -> None:
        """`conn`'s requests now arrive on `handler` (aiohttp's protocol, made once TLS is up)."""
        if conn in self._phase:
            self._by_handler[handler] = conn

    def of(self, handler: object) -> Tracked | None:
        return self._by_handler.get(handler)

    def enter(self, conn: Tracked, phase: Phase) -> None:
        """Move a tracked connection to `phase` (a no-op for one already dropped or lost)."""
        if conn in self._phase:
            self._enter(conn, phase)

    def phase(self, conn: Tracked) -> Phase | None:
        return self._phase.get(conn)

    def deciding(self, request: web.BaseRequest) -> None:
        """The request has arrived whole: its connection is no longer evicted or timed out."""
        conn = self.of(request.protocol)
        if conn is not None:
            self.enter(conn, Phase.DECIDING)

    def hang_up(self, request: web.BaseRequest) -> None:
        """The request is refused before its body was read whole (too large, or its HTTP
        framing broke): read nothing more of it, and drop its connection once the answer
        had `ANSWER_GRACE` seconds to reach the client (`_TlsConnection.hang_up`)."""
        conn = self.of(request.protocol)
        if conn is not None:
            # aiohttp waits on the body it lingers over until it ends: end it when the
            # connection goes, or its task would outlive the connection by that wait.
            conn.hang_up(request.content.feed_eof)

    def lost(self, conn: Tracked, handler: object | None) -> None:
        """The connection closed (whoever closed it)."""
        if handler is not None:
            self._by_handler.pop(handler, None)
        phase = self._phase.pop(conn, None)
        if phase is not None:
            del self._phases[phase][conn]
            self._forget(conn)

    def expire(self) -> None:
        """Drop every connection whose phase's deadline has passed."""
        now = self._clock()
        for phase, queue in self._phases.items():
            timeout = self.limits.timeout(phase)
            if timeout is None:
                continue
            while queue:
                conn, since = next(iter(queue.items()))
                if now - since < timeout:
                    break
                self._drop(conn, phase.name.lower())

    def close_opening(self) -> None:
        """Drop the connections no request has reached yet (shutdown: nobody waits on them)."""
        for conn in list(self._phases[Phase.OPENING]):
            self._drop(conn, "shutdown")

    async def opened_requests(self, timeout: float) -> None:
        """Wait up to `timeout` seconds until no connection is still to bring its first request."""
        deadline = self._clock() + timeout
        while self._phases[Phase.OPENING] and self._clock() < deadline:
            await asyncio.sleep(0.05)

    async def run(self) -> None:
        """Expire connections every `SWEEP_SECONDS` until cancelled."""
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            self.expire()

    def _victim(self, source: str) -> Tracked | None:
        """The connection worth least (module doc), among the first `EVICTION_SCAN` in
        eviction order: a hog's that is not waiting on us; else, for a newcomer that is no
        hog, a hog's; else the first not waiting; else None."""
        scanned = list(islice((c for p, q in self._phases.items() if p is not Phase.DECIDING for c in q),
                              EVICTION_SCAN))
        hogs = [c for c in scanned if self._hogging(self._source[c])]
        # `waiting` is a system call: asked lazily, in order, until one answers no.
        quiet = next((c for c in hogs if not c.waiting()), None)
        if quiet is not None:
            return quiet
        if hogs:
            return None if self._hogging(source) else hogs[0]
        return next((c for c in scanned if not c.waiting()), None)

    def _hog_may_open(self) -> bool:
        """Whether a hog may have a new connection now (`HOG_NEW_PER_SECOND`, a token bucket)."""
        now = self._clock()
        self._hog_budget = min(HOG_NEW_PER_SECOND,
                               self._hog_budget + (now - self._hog_budget_at) * HOG_NEW_PER_SECOND)
        self._hog_budget_at = now
        if self._hog_budget < 1:
            return False
        self._hog_budget -= 1
        return True

    def _hogging(self, source: str) -> bool:
        """`source` holds more than half the cap: a flood (the API server keeps a pool of
        at most a few dozen; client-go keeps 25 idle)."""
        return self._held[source] > self.limits.max_connections // 2

    def _forget(self, conn: Tracked) -> None:
        source = self._source.pop(conn)
        self._held[source] -= 1
        if not self._held[source]:
            del self._held[source]

    def _enter(self, conn: Tracked, phase: Phase) -> None:
        old = self._phase.get(conn)
        if old is not None:
            del self._phases[old][conn]
        self._phase[conn] = phase
        self._phases[phase][conn] = self._clock()

    def _drop(self, conn: Tracked, why: str) -> None:
        phase = self._phase.pop(conn)
        del self._phases[phase][conn]
        self._forget(conn)
        self.dropped[why] += 1
        conn.abort()


# -- the aiohttp side -------------------------------------------------------------------------


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


# Why `Connections` drops one: a closed set (the `reason` label of webhook.metrics).
DROP_REASONS = ("evicted", "refused", "opening", "headers", "request", "idle", "shutdown")


# -- flags ------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Limits()
    group = parser.add_argument_group("connection bounds (each HTTPS listener: webhook, metrics)")
    group.add_argument("--max-connections", type=int, default=d.max_connections, metavar="N",
                       help="connections open at once on the webhook port; at the cap a new one evicts an idle or "
                            f"slow one (default {d.max_connections}; the metrics port takes at most 64)")
    group.add_argument("--tls-handshake-timeout", type=float, default=d.tls_handshake_timeout, metavar="SECONDS",
                       help=f"a TLS handshake not done by then is dropped (default {d.tls_handshake_timeout:g})")
    group.add_argument("--request-header-timeout", type=float, default=d.header_timeout, metavar="SECONDS",
                       help="a request's headers must be in this long after the connection opened, or after its "
                            f"first byte on a kept-alive connection (default {d.header_timeout:g})")
    group.add_argument("--request-body-timeout", type=float, default=d.body_timeout, metavar="SECONDS",
                       help=f"a request's body must be in this long after its headers (default {d.body_timeout:g})")
    group.add_argument("--idle-timeout", type=float, default=d.idle_timeout, metavar="SECONDS",
                       help="a kept-alive connection with no request for this long is closed; keep it above the API "
                            f"server's 90 s (default {d.idle_timeout:g})")


def from_args(args: argparse.Namespace) -> Limits:
    """The flags' bounds; ValueError says which one cannot work."""
    limits = Limits(max_connections=args.max_connections, tls_handshake_timeout=args.tls_handshake_timeout,
                    header_timeout=args.request_header_timeout, body_timeout=args.request_body_timeout,
                    idle_timeout=args.idle_timeout)
    problem = limits.problem()
    if problem is not None:
        raise ValueError(problem)
    return limits
