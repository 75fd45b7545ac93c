"""The HTTPS listeners' connections: how many, and how long each may take in every phase.

Neighbours: `commands.serve` starts the webhook's and the metrics' listeners as
`webhook.tlssite.TlsSite`s, each with its own `Connections`, listening through
`webhook.accepting.Listener`; `webhook.server` and `webhook.metricsserver` build their
apps with `webhook.tlssite.track` (the middleware that tells it when a request starts and
ends) and call `Connections.deciding` once a request has arrived whole. This module
decides (phases, deadlines, evictions) over `Tracked` connections; `webhook.tlssite`
is the aiohttp and asyncio side. `add_arguments`/`from_args` are the `dra-quota serve` flags.

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
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from itertools import islice
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

__all__ = ["DROP_REASONS", "Connections", "Limits", "Phase", "Tracked", "add_arguments", "from_args"]

# Every deadline is checked this often: a deadline holds to within a second.
SWEEP_SECONDS = 1.0
# How many connections with unread bytes one eviction passes over (module doc).
EVICTION_SCAN = 16
# How many new connections a second a hog is given; the rest are refused before anything
# is built for them (module doc, `webhook.accepting`).
HOG_NEW_PER_SECOND = 32.0


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
        had `webhook.tlssite.ANSWER_GRACE` seconds to reach the client (`_TlsConnection.hang_up`
        there)."""
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
