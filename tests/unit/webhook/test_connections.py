"""webhook.connections: a listener's connections are capped, and each phase has a deadline.

Over real sockets to the webhook app behind `TlsSite`: connections past the cap make
room by evicting the least useful ones (those no request reached, then slow ones, then
the least recently used idle ones), a connection whose review is being decided is
never evicted or timed out, and every other phase ends at its deadline. The deadlines
run on a clock the test moves (`FakeClock`), so no test waits for one to pass; asyncio's
own TLS handshake timer is the exception (real time, a fraction of a second). The
same bounds with thousands of connections against the real `serve` process:
tests/e2e/test_connections.py, and bench/connections.py for 10,000.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
from collections.abc import Awaitable, Callable, Iterator

import pytest

from devcluster.kube import poll
from kube.admissionreview import AdmissionRequest, Verdict
from webhook.connections import EVICTION_SCAN, HOG_NEW_PER_SECOND, Connections, Limits, Phase
from webhook.tlssite import unread

from ..clock import FakeClock
from ..kube.test_admissionreview import REVIEW
from .wire import Wire, client_context, post, serving

ASYNC = pytest.mark.asyncio(loop_scope="session")
REVIEW_BODY = json.dumps(REVIEW).encode()
PATIENCE = 30.0  # how long a test waits for what it expects (never a bound it asserts)


async def allow(request: AdmissionRequest) -> Verdict:
    return Verdict(True)


def held(release: asyncio.Event) -> Callable[[AdmissionRequest], Awaitable[Verdict]]:
    async def decide(request: AdmissionRequest) -> Verdict:
        await release.wait()
        return Verdict(True)

    return decide


async def reviewed(wire: Wire) -> bool:
    await wire.send(post(REVIEW_BODY))
    answer = await wire.answer()
    return bool(answer.review()["allowed"]) and answer.review()["uid"] == REVIEW["request"]["uid"]


async def closed(wire: Wire) -> bool:
    async with asyncio.timeout(PATIENCE):
        return await wire.closed_by_server()


async def refused(port: int) -> bool:
    """A new connection is refused: reset as it connects, or closed before it sent anything."""
    try:
        wire = await Wire.open(port, tls=False)
    except ConnectionResetError:
        return True
    try:
        return await closed(wire)
    finally:
        await wire.close()


async def until(condition: Callable[[], bool], what: str) -> None:
    async def probe() -> bool:
        return condition()

    await poll(probe, timeout=PATIENCE, what=what)


# -- the cap ------------------------------------------------------------------------------------


@ASYNC
async def test_at_the_cap_connections_no_request_reached_make_room_and_a_kept_alive_one_stays() -> None:
    async with serving({"/validate": allow}, limits=Limits(max_connections=5)) as served:
        honest = await Wire.open(served.port)
        assert await reviewed(honest)
        idle = [await Wire.open(served.port, tls=False) for _ in range(20)]
        await until(lambda: served.connections.dropped["evicted"] == 16, "16 evictions")
        for wire in idle[:16]:
            assert await closed(wire)
        assert len(served.connections) == 5
        assert await reviewed(honest), "the connection that carried a review is evicted last"
        fresh = await Wire.open(served.port)
        assert await reviewed(fresh)
        for wire in (honest, fresh, *idle):
            await wire.close()


@ASYNC
async def test_when_every_connection_is_deciding_a_new_one_is_closed_at_once() -> None:
    release = asyncio.Event()
    async with serving({"/validate": held(release)}, limits=Limits(max_connections=2)) as served:
        deciding = [await Wire.open(served.port) for _ in range(2)]
        for wire in deciding:
            await wire.send(post(REVIEW_BODY))
        await until(lambda: served.connections.counts()[Phase.DECIDING] == 2, "two reviews deciding")
        assert await refused(served.port)
        assert served.connections.dropped == {"refused": 1}
        release.set()
        for wire in deciding:
            assert (await wire.answer()).review()["allowed"] is True
            await wire.close()


@ASYNC
async def test_past_the_hogs_budget_new_connections_are_refused_at_the_accept() -> None:
    """Over real sockets, every one from 127.0.0.1 (a hog: it holds the cap): once
    `HOG_NEW_PER_SECOND` new ones made room, the rest are refused as they are accepted
    (reset), and those held stay. The clock stands still but once: one instant."""
    clock = FakeClock(1000.0)
    budget = int(HOG_NEW_PER_SECOND)
    async with serving({"/validate": allow}, limits=Limits(max_connections=4), clock=clock) as served:
        held = [await Wire.open(served.port, tls=False) for _ in range(4)]
        await until(lambda: len(served.connections) == 4, "4 connections held")
        clock.now += 1  # the budget back whole
        late = []
        for _ in range(budget + 8):
            with contextlib.suppress(ConnectionResetError):  # refused before the connect returned
                late.append(await Wire.open(served.port, tls=False))
        await until(lambda: served.connections.dropped.total() == budget + 8, "every new connection decided")
        assert len(served.connections) == 4
        assert served.connections.dropped == {"evicted": budget, "refused": 8}
        for wire in (*held, *late):
            await wire.close()


# -- the deadlines ------------------------------------------------------------------------------


async def opening(wire: Wire) -> None:
    await wire.send(b"POST /validate HTTP/1.1\r\nHost: dra-quota.ns.svc\r\n")  # headers never end


async def headers(wire: Wire) -> None:
    assert await reviewed(wire)
    await wire.send(b"POST /validate HTTP/1.1\r\nHost: dra-quota.ns.svc\r\n")


async def request(wire: Wire) -> None:
    await wire.send(post(REVIEW_BODY)[:-10])  # the body never ends


async def idle(wire: Wire) -> None:
    assert await reviewed(wire)


@ASYNC
@pytest.mark.parametrize("phase,reach", [(Phase.OPENING, opening), (Phase.HEADERS, headers),
                                         (Phase.REQUEST, request), (Phase.IDLE, idle)],
                         ids=["opening", "headers", "request", "idle"])
async def test_a_connection_is_dropped_at_its_phases_deadline(phase: Phase,
                                                              reach: Callable[[Wire], Awaitable[None]]) -> None:
    clock = FakeClock(1000.0)
    limits = Limits(header_timeout=10, body_timeout=20, idle_timeout=120)
    async with serving({"/validate": allow}, limits=limits, clock=clock) as served:
        wire = await Wire.open(served.port)
        await reach(wire)
        await until(lambda: served.connections.counts()[phase] == 1, f"a connection in {phase.name}")
        timeout = limits.timeout(phase)
        assert timeout is not None
        clock.now += timeout - 1
        served.connections.expire()
        assert len(served.connections) == 1 and not served.connections.dropped, "dropped before its deadline"
        clock.now += 1
        served.connections.expire()
        assert await closed(wire)
        assert served.connections.dropped == {phase.name.lower(): 1}
        await wire.close()


@ASYNC
async def test_a_review_being_decided_has_no_connection_deadline() -> None:
    clock, release = FakeClock(1000.0), asyncio.Event()
    async with serving({"/validate": held(release)}, limits=Limits(), clock=clock) as served:
        wire = await Wire.open(served.port)
        await wire.send(post(REVIEW_BODY))
        await until(lambda: served.connections.counts()[Phase.DECIDING] == 1, "the review deciding")
        clock.now += 3600
        served.connections.expire()
        release.set()
        assert (await wire.answer()).review()["allowed"] is True
        assert not served.connections.dropped
        await wire.close()


@ASYNC
async def test_a_tls_handshake_that_never_comes_is_dropped() -> None:
    """asyncio's own timer (real time), whatever the request deadlines."""
    limits = Limits(tls_handshake_timeout=0.2, header_timeout=3600)
    async with serving({"/validate": allow}, limits=limits) as served:
        wire = await Wire.open(served.port, tls=False)
        await wire.send(b"\x16\x03\x01")  # the first bytes of a ClientHello, and no more
        assert await closed(wire)
        await until(lambda: len(served.connections) == 0, "the connection forgotten")
        await wire.close()


def reviewed_blocking(port: int) -> None:
    """A review over a blocking TLS socket (run in a thread): no client transport of asyncio's."""
    with socket.create_connection(("127.0.0.1", port)) as raw, \
            client_context().wrap_socket(raw, server_hostname="dra-quota.ns.svc") as tls:
        tls.sendall(post(REVIEW_BODY))
        assert tls.recv(65536).startswith(b"HTTP/1.1 200")


@contextlib.contextmanager
def left_to_the_collector() -> Iterator[list[type]]:
    """No collection meanwhile; on leaving, one, and the types of what it found (each
    object is kept by gc.DEBUG_SAVEALL until they are read, then let go)."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    found: list[type] = []
    try:
        yield found
        gc.collect()
        found.extend(type(o) for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@ASYNC
async def test_connections_that_end_leave_nothing_for_the_cyclic_collector() -> None:
    """Evicted before a handshake, or reviewed then closed by the client: each is freed at
    once. (asyncio's socket transport refers to itself; a flood of connections left
    thousands for the collector, whose passes stalled the loop up to 0.3 s.) The client
    side here is blocking sockets, so every socket transport in this process is serve's."""
    async with serving({"/validate": allow}, limits=Limits(max_connections=2)) as served:
        with left_to_the_collector() as found:
            await asyncio.to_thread(reviewed_blocking, served.port)
            idle = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(10)]
            await until(lambda: served.connections.dropped.get("evicted") == 8, "8 evictions")
            for sock in idle:
                sock.close()
            await until(lambda: len(served.connections) == 0, "every connection forgotten")
    left = sum(kind.__name__ == "_SelectorSocketTransport" for kind in found)
    assert left == 0, f"{left} of serve's closed transports were left to the cyclic collector"


@ASYNC
async def test_a_body_cut_off_midway_leaves_nothing_for_the_cyclic_collector() -> None:
    """A review whose client closes halfway through its body: the request, its reader and
    its handler are freed by reference counting. (aiohttp's reader keeps the
    ConnectionResetError it raised, whose traceback holds the handler's frames, which hold
    the request and so the reader: every slow body the flood's connections left was a
    cycle for the full collections.) Blocking client sockets, as above: every aiohttp
    object in this process is serve's."""
    async with serving({"/validate": allow}) as served:
        with left_to_the_collector() as found:
            cut = await asyncio.to_thread(started_then_cut, served.port)
            await until(lambda: served.connections.counts()[Phase.REQUEST] == 1, "the body being read")
            cut.close()
            await until(lambda: len(served.connections) == 0, "the connection forgotten")
    left = sum(kind.__module__.startswith("aiohttp.") for kind in found)
    assert left == 0, f"{left} aiohttp objects of a cut-off review were left to the cyclic collector"


def started_then_cut(port: int) -> socket.socket:
    """A TLS socket (blocking, made in a thread) that sent a review's headers and the first
    tenth of its body; the caller closes it."""
    raw = socket.create_connection(("127.0.0.1", port))
    tls = client_context().wrap_socket(raw, server_hostname="dra-quota.ns.svc")
    tls.sendall(post(REVIEW_BODY[:len(REVIEW_BODY) // 10], length=len(REVIEW_BODY)))
    return tls


# -- eviction order, without sockets ------------------------------------------------------------


class Fake:
    def __init__(self, name: str, aborted: list[str], *, unread: bool = False) -> None:
        self.name, self._aborted, self.unread = name, aborted, unread

    def abort(self) -> None:
        self._aborted.append(self.name)

    def waiting(self) -> bool:
        return self.unread

    def hang_up(self, ended: Callable[[], None]) -> None:
        raise AssertionError("eviction never hangs up")


def test_eviction_takes_opening_then_headers_then_request_then_the_least_recently_idle_never_deciding() -> None:
    clock, aborted = FakeClock(1000.0), list[str]()
    connections = Connections(Limits(max_connections=1), clock=clock)
    conns = {name: Fake(name, aborted) for name in ("idle-old", "deciding", "request", "headers", "opening",
                                                    "idle-new")}
    for name, conn in conns.items():
        connections.opened(conn)
        clock.now += 1
    for name, phase in (("idle-old", Phase.IDLE), ("deciding", Phase.DECIDING), ("request", Phase.REQUEST),
                        ("headers", Phase.HEADERS), ("idle-new", Phase.IDLE)):
        connections.enter(conns[name], phase)
        clock.now += 1
    assert connections.room() is False
    assert aborted == ["opening", "headers", "request", "idle-old", "idle-new"]
    assert connections.dropped == {"evicted": 5, "refused": 1}
    assert connections.counts()[Phase.DECIDING] == 1 and len(connections) == 1


def admit(connections: Connections, clock: FakeClock, conn: Fake, source: str = "") -> bool:
    """Accept `conn` from `source` as `TlsSite` does (room, then opened), a second apart."""
    if not connections.room(source):
        return False
    connections.opened(conn, source)
    clock.now += 1
    return True


def test_eviction_passes_over_connections_whose_bytes_we_have_not_read_and_refuses_when_all_in_line_are() -> None:
    """The oldest opening connection is the API server's, its handshake unread after a
    stall of the loop: newer silent ones go first, then idle ones; once the first
    `EVICTION_SCAN` in line are all waiting on us, the new connection is refused."""
    clock, aborted = FakeClock(1000.0), list[str]()
    connections = Connections(Limits(max_connections=4), clock=clock)
    for conn in (Fake("api-server", aborted, unread=True), Fake("silent", aborted), Fake("idle", aborted),
                 Fake("trickling", aborted, unread=True)):
        assert admit(connections, clock, conn)
        if conn.name == "idle":
            connections.enter(conn, Phase.IDLE)
    assert [admit(connections, clock, Fake(f"new-{i}", aborted, unread=True)) for i in range(3)] == [True, True, False]
    assert aborted == ["silent", "idle"], "the API server's connection is never evicted while it waits on us"
    assert connections.dropped == {"evicted": 2, "refused": 1}

    flood = [Fake(f"unread-{i}", aborted, unread=True) for i in range(EVICTION_SCAN)]
    connections = Connections(Limits(max_connections=len(flood) + 1), clock=clock)
    for conn in (*flood, Fake("silent-last", aborted)):
        assert admit(connections, clock, conn)
    assert not admit(connections, clock, Fake("newest", aborted)), "a scan is bounded: the silent one is past it"
    assert "silent-last" not in aborted


def test_a_flood_from_one_source_evicts_its_own_connections_not_the_api_servers() -> None:
    """The API server (10.0.0.1) holds a few connections, a Pod (10.9.9.9) floods the port:
    the flood's connections make room, the API server's stay even when older, quiet or
    the flood's wait on us; a new connection from the flood is refused once all of its
    own wait on us; from a single source the order alone decides."""
    clock, aborted = FakeClock(1000.0), list[str]()
    connections = Connections(Limits(max_connections=4), clock=clock)

    api = Fake("api-server", aborted)
    assert admit(connections, clock, api, "10.0.0.1")
    flood = [Fake(f"flood-{i}", aborted) for i in range(6)]
    assert all(admit(connections, clock, conn, "10.9.9.9") for conn in flood)
    assert aborted == ["flood-0", "flood-1", "flood-2"], "the oldest and quiet API server connection stays"
    for conn in flood[3:]:
        conn.unread = True  # a stall: the flood's handshakes sit unread
    assert not admit(connections, clock, Fake("flood-new", aborted), "10.9.9.9"), "the flood's own wait on us: refused"
    assert admit(connections, clock, Fake("api-new", aborted), "10.0.0.1")
    assert aborted[-1] == "flood-3", "the API server's new one is not refused: a flood's goes"
    assert connections.dropped == {"evicted": 4, "refused": 1}


@pytest.mark.parametrize("api_server", [True, False], ids=["beside-the-api-server", "alone"])
def test_a_flood_is_given_so_many_new_connections_a_second_and_the_api_server_all_it_asks(api_server: bool) -> None:
    """Each of a hog's new connections costs a protocol and a TLS handshake on the one
    event loop (at the cap an eviction too): a flood of them, re-opened as fast as they
    are dropped, took most of it (bench/connections.py). Past `HOG_NEW_PER_SECOND` a
    second they are refused (at the accept, before anything is built), at the cap or
    below it, whether or not another source holds connections; the API server's are not."""
    clock, aborted = FakeClock(1000.0), list[str]()
    budget = int(HOG_NEW_PER_SECOND)

    def flood(connections: Connections) -> bool:
        """A new connection from the flood, at the same instant as the others."""
        if not connections.room("10.9.9.9"):
            return False
        connections.opened(Fake("flood", aborted), "10.9.9.9")
        return True

    at_cap = Connections(Limits(max_connections=8), clock=clock)
    if api_server:
        assert admit(at_cap, clock, Fake("api-server", aborted), "10.0.0.1")
    while len(at_cap) < 8:
        assert admit(at_cap, clock, Fake("flood", aborted), "10.9.9.9")
    assert [flood(at_cap) for _ in range(3 * budget)] == [True] * budget + [False] * 2 * budget
    assert at_cap.dropped == {"evicted": budget, "refused": 2 * budget}
    assert admit(at_cap, clock, Fake("api-new", aborted), "10.0.0.1"), "the API server's still evicts a flood's"
    assert sum(flood(at_cap) for _ in range(budget)) == budget, "a second later the budget is back"

    below = Connections(Limits(max_connections=10 * budget), clock=clock)
    while len(below) <= 5 * budget:  # a hog from here on
        assert admit(below, clock, Fake("flood", aborted), "10.9.9.9")
    assert [flood(below) for _ in range(2 * budget)] == [True] * budget + [False] * budget
    assert len(below) < below.limits.max_connections and below.dropped == {"refused": budget}
    if api_server:
        assert all(admit(below, clock, Fake("api-server", aborted), "10.0.0.1") for _ in range(budget + 1))


@pytest.mark.parametrize("api_phase,api_unread", [(Phase.IDLE, False), (Phase.OPENING, True)],
                         ids=["kept-alive", "handshake-unread"])
def test_a_flood_spread_over_pods_that_each_hold_fewer_than_the_api_server_does_not_make_it_the_victim(
        api_phase: Phase, api_unread: bool) -> None:
    """No source holds more than half the cap: the order alone decides, so the API
    server's pooled connections (its kept-alive ones, or new ones whose handshake waits on
    us) are not evicted for holding more than each Pod does."""
    clock, aborted = FakeClock(1000.0), list[str]()
    connections = Connections(Limits(max_connections=4), clock=clock)

    for i in range(2):
        api = Fake(f"api-{i}", aborted, unread=api_unread)
        assert admit(connections, clock, api, "10.0.0.1")
        connections.enter(api, api_phase)
    for name, source in (("pod-a", "10.9.0.1"), ("pod-b", "10.9.0.2"), ("pod-c", "10.9.0.3")):
        assert admit(connections, clock, Fake(name, aborted), source)
    assert aborted == ["pod-a"]


def test_unread_counts_the_bytes_the_kernel_holds_for_a_socket() -> None:
    left, right = socket.socketpair()
    with left, right:
        assert unread(right.fileno()) == 0
        left.sendall(b"ClientHello")
        assert unread(right.fileno()) == len(b"ClientHello")
        right.recv(5)
        assert unread(right.fileno()) == len(b"ClientHello") - 5
    assert unread(right.fileno()) == 0, "a closed socket (fileno -1) has nothing to read"


@pytest.mark.parametrize("limits,problem", [
    (Limits(max_connections=0), "--max-connections must be at least 1"),
    (Limits(idle_timeout=0), "--idle-timeout must be positive"),
    (Limits(header_timeout=-1), "--request-header-timeout must be positive"),
])
def test_limits_that_cannot_work_say_which_flag(limits: Limits, problem: str) -> None:
    assert (limits.problem() or "").startswith(problem)
