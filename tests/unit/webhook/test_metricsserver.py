"""webhook.metricsserver: who may scrape, decided by the API server, cached and bounded.

The API server's answers are scripted here (`Reviews`) so the cache can be driven past
its bound and its TTLs on a clock the test moves; the same path against the real API
server, with real tokens and RBAC, is tests/e2e/test_connections.py.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from certs.tls import server_context
from kube.api import Resource
from kube.apierror import ApiError
from webhook.metrics import Metrics
from webhook.metricsserver import ALLOWED_TTL, MAX_CACHED, REFUSED_TTL, Access, TokenAccess, serve_metrics
from webhook.server import SERVER

from ..clock import FakeClock, until
from .wire import MATERIAL, client_context

ASYNC = pytest.mark.asyncio(loop_scope="session")
ALICE = {"username": "system:serviceaccount:monitoring:prometheus", "uid": "u-1",
         "groups": ["system:serviceaccounts"], "extra": {"x": ["y"]}}


class Reviews:
    """A scripted API server: tokens it knows (-> user), users allowed to get /metrics."""

    def __init__(self) -> None:
        self.users: dict[str, dict[str, Any]] = {"good": ALICE, "other": {"username": "bob"}}
        self.allowed = {ALICE["username"]}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.failing = False

    async def create(self, resource: Resource, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((resource.plural, body["spec"]))
        if self.failing:
            raise ApiError(500, "InternalError", "etcd is sad")
        if resource.plural == "tokenreviews":
            user = self.users.get(body["spec"]["token"])
            return {"status": {"authenticated": True, "user": user} if user else {"authenticated": False}}
        return {"status": {"allowed": body["spec"]["user"] in self.allowed}}


def access() -> tuple[TokenAccess, Reviews, FakeClock]:
    reviews, clock = Reviews(), FakeClock()
    return TokenAccess(reviews, clock=clock), reviews, clock  # type: ignore[arg-type]


@ASYNC
@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer   ", "Basic Z29vZA==", "good"])
async def test_no_bearer_token_is_401_without_asking(header: str | None) -> None:
    checker, reviews, _ = access()
    assert (await checker.check(header)).status == 401
    assert reviews.calls == []


@ASYNC
async def test_the_token_is_reviewed_then_its_user_asked_for_get_on_metrics() -> None:
    checker, reviews, _ = access()
    assert await checker.check("Bearer good") == Access(200, "")
    assert reviews.calls == [("tokenreviews", {"token": "good"}),
                             ("subjectaccessreviews", {"user": ALICE["username"], "uid": "u-1", "groups": ALICE["groups"],
                                                       "extra": ALICE["extra"],
                                                       "nonResourceAttributes": {"path": "/metrics", "verb": "get"}})]
    assert await checker.check("bearer other") == Access(403, "Forbidden: bob may not get /metrics")
    assert (await checker.check("Bearer made-up")).status == 401
    assert len(reviews.calls) == 5  # the made-up token: a TokenReview, no SubjectAccessReview


@ASYNC
async def test_decisions_are_cached_for_their_ttl_and_failures_never() -> None:
    checker, reviews, clock = access()
    for token, status, ttl in (("good", 200, ALLOWED_TTL), ("other", 403, REFUSED_TTL), ("made-up", 401, REFUSED_TTL)):
        assert (await checker.check(f"Bearer {token}")).status == status
        asked = len(reviews.calls)
        clock.now += ttl - 1
        assert (await checker.check(f"Bearer {token}")).status == status
        assert len(reviews.calls) == asked, f"{token}: asked again inside its TTL"
        clock.now += 1
        await checker.check(f"Bearer {token}")
        assert len(reviews.calls) > asked, f"{token}: not asked again after its TTL"
    reviews.failing = True
    assert (await checker.check("Bearer new")).status == 503
    reviews.failing = False
    assert (await checker.check("Bearer good")).status == 200  # still cached
    reviews.users["new"] = ALICE
    assert (await checker.check("Bearer new")).status == 200, "a failure to ask was cached"


@ASYNC
async def test_the_cache_holds_at_most_max_cached_tokens_dropping_the_least_recently_used() -> None:
    checker, reviews, _ = access()
    await checker.check("Bearer good")
    for i in range(MAX_CACHED + 50):
        await checker.check(f"Bearer made-up-{i}")
        if i % 100 == 0:
            await checker.check("Bearer good")  # kept in use: never the least recently used
    asked = len(reviews.calls)
    await checker.check("Bearer good")
    assert len(reviews.calls) == asked, "the token in use was dropped"
    await checker.check("Bearer made-up-0")
    assert len(reviews.calls) == asked + 1, "the oldest token is still cached"
    assert len(checker._cache) == MAX_CACHED


@ASYNC
async def test_over_https_no_token_is_401_a_user_without_the_right_403_and_one_with_it_gets_the_metrics() -> None:
    reviews = Reviews()
    metrics = Metrics()
    runner, port = await serve_metrics(metrics, host="127.0.0.1", port=0,
                                       context=server_context(MATERIAL.serving), access=TokenAccess(reviews))  # type: ignore[arg-type]
    try:
        async with aiohttp.ClientSession() as http:
            for token, status in ((None, 401), ("other", 403), ("good", 200)):
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                async with http.get(f"https://127.0.0.1:{port}/metrics", headers=headers,
                                    ssl=client_context(), server_hostname="dra-quota.ns.svc") as resp:
                    body = await resp.text()
                    assert resp.status == status, (token, resp.status, body)
                    assert resp.headers["Server"] == SERVER
                    assert ("draquota_build_info" in body) == (status == 200)
    finally:
        await runner.cleanup()


@ASYNC
async def test_plain_http_metrics_are_served_on_loopback_only() -> None:
    with pytest.raises(ValueError, match="plain-HTTP metrics are served on a loopback address only, not 0.0.0.0"):
        await serve_metrics(Metrics(), host="0.0.0.0", port=0, context=None, access=None)


@ASYNC
async def test_scrapes_go_through_render_one_at_a_time_and_a_large_body_arrives_whole() -> None:
    """`serve` renders each scrape in slices (`render`); two scrapes never build the usage
    metrics' caches at once, and a body larger than a write is sent whole."""
    import asyncio

    metrics = Metrics()
    big = b"# " + b"x" * (600 * 1024) + b"\n"  # over two of the writes a body is sent in
    metrics.rendered(lambda: (b"# small\n", big))
    running, most, release = [0], [0], asyncio.Event()

    async def render(exposition: Any) -> list[bytes]:
        running[0] += 1
        most[0] = max(most[0], running[0])
        await release.wait()
        running[0] -= 1
        return list(exposition())

    runner, port = await serve_metrics(metrics, host="127.0.0.1", port=0, context=None, access=None, render=render)
    try:
        async with aiohttp.ClientSession() as session:
            async def get() -> bytes:
                async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    return await resp.read()

            both = asyncio.gather(get(), get())
            # Both requests in their handlers (aiohttp counts one as its handler starts),
            # then ten turns of the loop: the second is at `render` by then unless
            # something keeps it out.
            await until(lambda: running[0] >= 1 and runner.server is not None and runner.server.requests_count == 2,
                        "both scrapes in their handlers, one at least rendering")
            for _ in range(10):
                await asyncio.sleep(0)
            release.set()
            bodies = await both
    finally:
        await runner.cleanup()
    assert most[0] == 1
    assert all(body.endswith(b"# small\n" + big) for body in bodies)


@ASYNC
async def test_a_scrape_body_is_written_a_piece_at_a_time_giving_the_loop_back_between(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A write awaits nothing while the reader keeps up: without a pause between pieces
    a body of tens of MB went out in one turn of the loop."""
    import asyncio

    from aiohttp import web

    from webhook import metricsserver

    monkeypatch.setattr(metricsserver, "_WRITE_CHUNK", 1024)
    metrics = Metrics()
    metrics.rendered(lambda: [b"# " + b"x" * 1000 + b"\n"] * 8)
    turns, at_writes = [0], []

    async def ticker() -> None:
        while True:
            await asyncio.sleep(0)
            turns[0] += 1

    write = web.StreamResponse.write

    async def counted(self: web.StreamResponse, data: Any) -> None:
        at_writes.append(turns[0])
        await write(self, data)

    monkeypatch.setattr(web.StreamResponse, "write", counted)
    runner, port = await serve_metrics(metrics, host="127.0.0.1", port=0, context=None, access=None)
    task = asyncio.create_task(ticker())
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            body = await resp.read()
    finally:
        task.cancel()
        await runner.cleanup()
    assert body.count(b"# xxx") == 8
    assert len(at_writes) >= 8 and all(a < b for a, b in zip(at_writes, at_writes[1:])), at_writes
