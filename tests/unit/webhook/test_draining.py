"""A replica that shuts down ends its connections cleanly (`Connections.drain`, `Listener.close`).

The API server writes its next review on a kept-alive connection whenever it likes, so a
connection closed under it fails that call ("EOF": under failurePolicy Fail, a refused
create; tests/e2e/test_rolling_upgrade.py saw 4-11 in a rolling upgrade before this).
Over real sockets: once draining, every answer says `Connection: close` and closes its
connection; and a listener that closes first accepts and serves the connections waiting in the kernel's queue, which closing it
would reset (with SO_REUSEPORT the kernel hands a leaving replica connections until then).
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from webhook.accepting import Listener

from .test_connections import REVIEW_BODY, allow, closed, until
from .wire import Wire, post, serving

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_once_draining_every_answer_closes_its_connection_cleanly() -> None:
    async with serving({"/validate": allow}) as served:
        wire = await Wire.open(served.port)
        await wire.send(post(REVIEW_BODY))
        kept = await wire.answer()
        assert kept.headers.get("connection", "keep-alive").lower() != "close"
        served.connections.drain()
        await wire.send(post(REVIEW_BODY))
        last = await wire.answer()
        assert last.review()["allowed"] is True
        assert last.headers.get("connection", "").lower() == "close", last.headers
        assert await closed(wire)
        await wire.close()


class Greeting(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(b"served")  # type: ignore[attr-defined]
        transport.close()


def connected(port: int, count: int) -> list[socket.socket]:
    """`count` connections the kernel completed and queued (blocking connects, no loop turn)."""
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(count)]


def received(sock: socket.socket) -> bytes:
    try:
        return sock.recv(64)
    except ConnectionResetError:
        return b"reset"
    finally:
        sock.close()


async def test_a_closing_listener_serves_the_connections_waiting_in_its_queue() -> None:
    listener = await Listener.open("127.0.0.1", 0, lambda source: Greeting())
    port = listener.sockets[0].getsockname()[1]
    waiting = connected(port, 5)
    listener.close()  # no loop turn since the connects: all five still in the kernel's queue
    await listener.wait_closed()
    answers = await asyncio.gather(*(asyncio.to_thread(received, s) for s in waiting))
    assert answers == [b"served"] * 5
