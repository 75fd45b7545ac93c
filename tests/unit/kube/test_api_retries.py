"""KubeApi on a 429: tried again after its Retry-After, as client-go does, then given up.

Over a real loopback socket: an aiohttp server that answers 429 (the API server's
priority and fairness refusing a request before doing anything) a given number of times.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import web
from kubernetes_asyncio.client import Configuration

from kube.api import TOO_MANY_REQUESTS_RETRIES, KubeApi
from kube.apierror import ApiError
from kube.writegate import WRITE_GATE, NotLeading, ungated


class Refusing:
    """Answers 429 `refusals` times, then 200 with an empty object; counts the calls."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.calls = 0
        self.types: list[str] = []
        self.bodies: list[object] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.calls += 1
        self.types.append(request.content_type)
        if request.can_read_body:
            self.bodies.append(await request.json())
        if self.calls <= self.refusals:
            return web.json_response({"kind": "Status", "reason": "TooManyRequests",
                                      "message": "Too many requests, please try again later."},
                                     status=429, headers={"Retry-After": "0"})
        return web.json_response({"kind": "Thing", "seen": request.method})


@pytest_asyncio.fixture(loop_scope="function")  # the test's own loop: the server must answer on it
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[KubeApi, Refusing]]:
    refusing = Refusing(request.param)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", refusing.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    configuration = Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    api = KubeApi(configuration)
    try:
        yield api, refusing
    finally:
        await api.close()
        await runner.cleanup()


@pytest.mark.parametrize("served", [3], indirect=True)
async def test_a_write_refused_with_429_goes_again_and_lands(served: tuple[KubeApi, Refusing]) -> None:
    api, refusing = served
    answer = await api.request("PUT", "/apis/draquota.io/v1alpha1/clusterdevicequotas/t/status", body={"a": 1})
    assert answer == {"kind": "Thing", "seen": "PUT"}
    assert refusing.calls == 4


@pytest.mark.parametrize("served", [1000], indirect=True)
async def test_past_the_retries_the_429_is_the_answer(served: tuple[KubeApi, Refusing]) -> None:
    api, refusing = served
    with pytest.raises(ApiError) as caught:
        await api.request("POST", "/api/v1/namespaces/a/events", body={})
    assert caught.value.status == 429
    assert refusing.calls == TOO_MANY_REQUESTS_RETRIES + 1


@pytest.mark.parametrize("served", [1], indirect=True)
async def test_a_write_whose_gate_closed_while_it_waited_is_not_sent(served: tuple[KubeApi, Refusing]) -> None:
    """The gate is asked immediately before each send, the retry of a 429 included: a
    leader that lost its Lease while its write waited sends nothing more; reads pass."""
    api, refusing = served
    holds = iter([True, True, True, False])  # the first try's three looks (before it, at its connection, its body)
    token = WRITE_GATE.set(lambda: next(holds))
    try:
        with pytest.raises(NotLeading):
            await api.request("PUT", "/apis/draquota.io/v1alpha1/devicequotas/t/status", body={"a": 1})
        assert refusing.calls == 1  # the first try, refused with 429; the retry was never sent
        assert await api.request("GET", "/apis/draquota.io/v1alpha1/devicequotas/t") == {"kind": "Thing", "seen": "GET"}
    finally:
        WRITE_GATE.reset(token)


async def test_a_write_queued_for_a_pooled_connection_is_not_sent_once_the_gate_closed() -> None:
    """Every connection of the pool (64) held by a write in flight: one more waits for a
    connection; the gate closes meanwhile, and when a connection frees up the waiting
    write is refused there, never sent."""
    held, release = asyncio.Event(), asyncio.Event()
    calls = 0

    async def handle(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        if calls >= POOL:
            held.set()
        await release.wait()
        return web.json_response({"kind": "Thing"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    configuration = Configuration()
    configuration.host = f"http://127.0.0.1:{runner.addresses[0][1]}"
    api = KubeApi(configuration)
    holds = True
    token = WRITE_GATE.set(lambda: holds)
    try:
        writes = [asyncio.create_task(api.request("PUT", f"/things/{i}", body={})) for i in range(POOL + 1)]
        await asyncio.wait_for(held.wait(), 10)
        holds = False  # the Lease is lost while the last write waits for a connection
        release.set()
        results = await asyncio.gather(*writes, return_exceptions=True)
        assert [r for r in results if isinstance(r, BaseException)] == [results[-1]]
        assert isinstance(results[-1], NotLeading)
        assert calls == POOL
    finally:
        WRITE_GATE.reset(token)
        await api.close()
        await runner.cleanup()


POOL = 64  # KubeApi's connections per API server


@pytest.mark.parametrize("served", [0], indirect=True)
async def test_the_gate_is_asked_last_as_the_body_is_written(served: tuple[KubeApi, Refusing]) -> None:
    """aiohttp writes a request's body in a task of its own once the request has its
    connection: a gate that closes in between (a process frozen there) refuses the write
    then, and the API server gets no request. A gated write that goes keeps its type."""
    api, refusing = served
    looks = iter([True, True, False])  # before the try, at its connection, as its body is written
    token = WRITE_GATE.set(lambda: next(looks))
    try:
        with pytest.raises(NotLeading):
            await api.request("PATCH", "/apis/draquota.io/v1alpha1/devicequotas/t", body={"a": 1},
                              content_type="application/merge-patch+json")
        assert refusing.calls == 0
    finally:
        WRITE_GATE.reset(token)
    token = WRITE_GATE.set(lambda: True)
    try:
        answer = await api.request("PATCH", "/apis/draquota.io/v1alpha1/devicequotas/t", body={"a": 1},
                                   content_type="application/merge-patch+json")
        assert answer == {"kind": "Thing", "seen": "PATCH"}
        assert refusing.types == ["application/merge-patch+json"] and refusing.bodies == [{"a": 1}]
    finally:
        WRITE_GATE.reset(token)


@pytest.mark.parametrize("served", [0], indirect=True)
async def test_a_task_started_ungated_by_a_gated_writer_writes_for_everyone(served: tuple[KubeApi, Refusing]) -> None:
    """A quota's batch of status writes is started by whichever writer comes first, the
    leader's controller included; it carries every replica's admissions, which a closed
    gate inherited from that writer would refuse."""
    api, refusing = served
    token = WRITE_GATE.set(lambda: False)
    try:
        batch = asyncio.create_task(api.request("PUT", "/apis/draquota.io/v1alpha1/devicequotas/t/status",
                                                body={"a": 1}), context=ungated())
        assert await batch == {"kind": "Thing", "seen": "PUT"}
        assert refusing.calls == 1
    finally:
        WRITE_GATE.reset(token)
