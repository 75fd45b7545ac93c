"""kube.contact: a replica the API server no longer answers is not ready and answers 503
to every review, so the webhooks' failurePolicy decides; it decides again once it answers.

The probe runs against a stub of the API server's `/readyz` (answering, failing, or
hanging) on a clock the test moves; the review side over a real socket to `build_app`.
tests/e2e/test_cut_off.py cuts a real `serve` off the real API server.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web

from kube.admissionreview import AdmissionRequest, Verdict
from kube.api import KubeApi
from kube.apierror import ApiError
from kube.contact import Contact
from webhook.server import build_app

from ..clock import FakeClock
from .test_admissionreview import REVIEW

ASYNC = pytest.mark.asyncio(loop_scope="session")


class Server:
    """The API server's `/readyz` as the probe sees it: "ok", an error, or no answer."""

    server = "https://127.0.0.1:6443"

    def __init__(self) -> None:
        self.answer: str | BaseException = "ok"
        self.hang = False
        self.closed = False

    async def text(self, path: str) -> str:
        assert path == "/readyz"
        if self.hang:
            await asyncio.Event().wait()
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    async def close(self) -> None:
        self.closed = True


def contact(server: Server, clock: FakeClock, grace: float = 10.0) -> Contact:
    return Contact(cast(KubeApi, server), interval=1.0, grace=grace, clock=clock)


@ASYNC
async def test_unanswered_for_the_grace_it_is_cut_off_and_says_why_then_back_once_it_answers(
        caplog: pytest.LogCaptureFixture) -> None:
    clock, server = FakeClock(100.0), Server()
    c = contact(server, clock)
    await c.probe()
    assert c.reachable() and c.unavailable() == ""
    server.answer = aiohttp.ClientConnectionError("connection refused")
    clock.advance(9.9)
    await c.probe()
    assert c.reachable(), "within the grace the replica decides as before"
    clock.advance(0.2)
    with caplog.at_level(logging.WARNING, logger="kube.contact"):
        await c.probe()
    assert not c.reachable() and c.cut_offs == 1
    assert "dra-quota cannot reach the API server: its caches may be stale" in c.unavailable()
    assert "cannot reach the API server https://127.0.0.1:6443 for 10s (connection refused)" in caplog.text
    server.answer = ApiError(500, "InternalError", "etcd not ready")  # an answer, but not a ready API server
    clock.advance(1)
    await c.probe()
    assert not c.reachable() and c.cut_offs == 1, "one cut, said once"
    server.answer = "ok"
    with caplog.at_level(logging.INFO, logger="kube.contact"):
        await c.probe()
    assert c.reachable() and c.unavailable() == ""
    assert "answers again after 11.1s" in caplog.text


@ASYNC
async def test_a_probe_with_no_answer_ends_at_the_grace() -> None:
    clock, server = FakeClock(100.0), Server()
    c = contact(server, clock, grace=0.05)  # real seconds for the probe's own timeout
    server.hang = True
    clock.advance(1)
    async with asyncio.timeout(10):
        await c.probe()
    assert not c.reachable() and c.cut_offs == 1


async def allow(request: AdmissionRequest) -> Verdict:
    return Verdict(True)


@ASYNC
async def test_while_cut_off_every_review_is_answered_503_with_our_words_and_counted() -> None:
    why = ["dra-quota cannot reach the API server: ...; retry"]
    seen: list[tuple[str, Verdict]] = []
    app = build_app({"/admit": allow}, ready=lambda: True, unavailable=lambda: why[0],
                    observe=lambda path, review, verdict, seconds: seen.append((path, verdict)))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as http:
            async def post() -> tuple[int, Any, str]:
                async with http.post(f"http://127.0.0.1:{port}/admit", data=json.dumps(REVIEW)) as resp:
                    return resp.status, await resp.json(), resp.headers.get("Connection", "").lower()

            status, body, connection = await post()
            assert status == 503 and connection == "close"
            assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": why[0], "reason": "ServiceUnavailable", "code": 503}
            assert [(p, v.cause, v.allowed) for p, v in seen] == [("/admit", "unavailable", False)]
            why[0] = ""
            status, body, connection = await post()
            assert status == 200 and body["response"]["allowed"] is True and connection != "close"
    finally:
        await runner.cleanup()
