"""webhook.server over real HTTPS on loopback: always a review, never a 500."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from certs.authority import service_names
from certs.rotation import Policy, plan
from certs.tls import server_context
from kube.admissionreview import AdmissionRequest, Verdict, parse_review
from runtime.logbounds import DENIALS_PER_INTERVAL
from webhook.server import _deadline, _decide, build_app

from ..kube.test_admissionreview import REVIEW, review

# The server fixture runs on the session loop (pyproject's default fixture loop scope).
pytestmark = pytest.mark.asyncio(loop_scope="session")
READY = {"value": False}


async def allow(request: AdmissionRequest) -> Verdict:
    return Verdict(True, warnings=(f"seen {request.name}",))


async def crash(request: AdmissionRequest) -> Verdict:
    raise KeyError("a bug")


LONG = "request s0: device class 'missing' not found; " * 2000  # ~96,000 characters, as a tenant can make one


async def deny(request: AdmissionRequest) -> Verdict:
    return Verdict(False, LONG)


async def stall(request: AdmissionRequest) -> Verdict:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


@pytest.fixture
async def base_url() -> AsyncIterator[tuple[str, ssl.SSLContext]]:
    minted = plan(None, Policy(dns_names=service_names("dra-quota", "ns"), ip_addresses=("127.0.0.1",)),
                  now=datetime.now(timezone.utc), trusted=frozenset())
    assert minted is not None
    app = build_app({"/validate": allow, "/crash": crash, "/stall": stall, "/deny": deny}, ready=lambda: READY["value"],
                    max_body_bytes=64 * 1024)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context(minted.material.serving))
    await site.start()
    port = runner.addresses[0][1]
    client = ssl.create_default_context(cadata=minted.material.bundle[0].decode())
    try:
        yield f"https://127.0.0.1:{port}", client
    finally:
        await runner.cleanup()


async def post(base: tuple[str, ssl.SSLContext], path: str, body: bytes) -> tuple[int, Any]:
    url, client = base
    async with aiohttp.ClientSession() as session:
        async with session.post(url + path, data=body, ssl=client, headers={"Content-Type": "application/json"}) as resp:
            return resp.status, await resp.json()


async def test_a_review_is_answered_with_the_uid(base_url: tuple[str, ssl.SSLContext]) -> None:
    status, out = await post(base_url, "/validate", json.dumps(REVIEW).encode())
    assert status == 200
    assert out["response"] == {"uid": REVIEW["request"]["uid"], "allowed": True, "warnings": ["seen gpu-x7k2q"]}


@pytest.mark.parametrize(
    ("body", "message", "uid"),
    [
        (b"not json", "malformed AdmissionReview: the body is not JSON", ""),
        (b"[" * 20000 + b"]" * 20000, "malformed AdmissionReview: the body is not JSON", ""),
        (b"\xff\xfe", "malformed AdmissionReview: the body is not JSON", ""),
        (json.dumps(review(operation="PATCH")).encode(), "malformed AdmissionReview: request.operation must be one of", REVIEW["request"]["uid"]),
        (b" " * (64 * 1024 + 1), "the AdmissionReview is larger than 65536 bytes", ""),
    ],
)
async def test_a_bad_body_gets_a_review_saying_what_is_wrong(
    base_url: tuple[str, ssl.SSLContext], body: bytes, message: str, uid: str
) -> None:
    status, out = await post(base_url, "/validate", body)
    assert status == 200
    assert out["response"]["allowed"] is False and out["response"]["uid"] == uid
    assert out["response"]["status"]["message"].startswith(message)


async def test_each_review_is_logged_with_its_uid(
    base_url: tuple[str, ssl.SSLContext], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="webhook.server"):
        await post(base_url, "/validate", json.dumps(REVIEW).encode())
        await post(base_url, "/crash", json.dumps(REVIEW).encode())
    (allowed, denied) = [r for r in caplog.records if hasattr(r, "allowed")]
    uid = REVIEW["request"]["uid"]
    assert (allowed.levelno, getattr(allowed, "allowed"), getattr(allowed, "uid")) == (logging.DEBUG, True, uid)
    assert (denied.levelno, getattr(denied, "allowed"), getattr(denied, "uid")) == (logging.INFO, False, uid)
    assert denied.getMessage().startswith(f"/crash denied CREATE {REVIEW['request']['namespace']}/")
    assert "dra-quota failed to evaluate" in denied.getMessage()


async def test_a_create_not_named_yet_is_logged_by_its_generate_name(
    base_url: tuple[str, ssl.SSLContext], caplog: pytest.LogCaptureFixture
) -> None:
    # The mutating admission sees a `generateName` CREATE before the API server names it.
    unnamed = json.loads(json.dumps(REVIEW))
    unnamed["request"]["name"] = ""
    unnamed["request"]["object"]["metadata"].pop("name", None)
    unnamed["request"]["object"]["metadata"]["generateName"] = "job-0-gpu-"
    with caplog.at_level(logging.INFO, logger="webhook.server"):
        await post(base_url, "/crash", json.dumps(unnamed).encode())
    (denied,) = [r for r in caplog.records if hasattr(r, "allowed")]
    assert denied.getMessage().startswith(f"/crash denied CREATE {REVIEW['request']['namespace']}/job-0-gpu-* uid=")
    (failed,) = [r for r in caplog.records if r.getMessage().startswith("failed deciding")]
    assert f"{REVIEW['request']['namespace']}/job-0-gpu-* uid=" in failed.getMessage()


async def test_a_namespaces_flood_of_denials_is_sampled_and_each_tenant_still_gets_the_whole_message(
    base_url: tuple[str, ssl.SSLContext], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="webhook.server"):
        answers = [await post(base_url, "/deny", json.dumps(review(namespace="mallory")).encode())
                   for _ in range(DENIALS_PER_INTERVAL + 5)]
        answers.append(await post(base_url, "/deny", json.dumps(review(namespace="alice")).encode()))
    assert all(status == 200 and out["response"]["status"]["message"] == LONG for status, out in answers)
    logged = [getattr(r, "namespace") for r in caplog.records if hasattr(r, "allowed")]
    # The first of mallory's interval, and alice's all the same: her namespace has its own.
    assert logged == ["mallory"] * DENIALS_PER_INTERVAL + ["alice"]


async def test_an_endpoint_that_fails_is_a_denial_not_a_500(base_url: tuple[str, ssl.SSLContext]) -> None:
    status, out = await post(base_url, "/crash", json.dumps(REVIEW).encode())
    assert status == 200
    assert out["response"]["status"]["message"].startswith("dra-quota failed to evaluate this request")


async def test_a_slow_endpoint_is_denied_inside_the_api_servers_timeout(base_url: tuple[str, ssl.SSLContext]) -> None:
    status, out = await post(base_url, "/stall?timeout=1s", json.dumps(REVIEW).encode())
    # The answer names the deadline it was given: half a second inside the API server's 1 s
    # (read from the message, not timed: a busy machine must not fail this).
    assert status == 200
    assert out["response"]["status"]["message"].startswith("dra-quota could not decide within the webhook timeout (0.5s)")


async def test_readiness_follows_the_caches(base_url: tuple[str, ssl.SSLContext]) -> None:
    url, client = base_url
    async with aiohttp.ClientSession() as session:
        READY["value"] = False
        async with session.get(url + "/readyz", ssl=client) as resp:
            assert resp.status == 503
        READY["value"] = True
        async with session.get(url + "/readyz", ssl=client) as resp:
            assert resp.status == 200
        async with session.get(url + "/healthz", ssl=client) as resp:
            assert resp.status == 200


@pytest.mark.parametrize(
    ("timeout", "deadline"),
    [("5s", 4.0), ("1m", 24.0), ("1500ms", 1.0), ("2.5s", 2.0), (None, 8.0), ("soon", 8.0), ("5", 8.0), ("100ms", 0.1)],
)
async def test_the_deadline_is_the_api_servers_go_duration_less_a_margin(timeout: str | None, deadline: float) -> None:
    assert _deadline(timeout) == pytest.approx(deadline)


async def test_a_review_whose_deadline_passed_before_its_endpoint_began_is_not_decided() -> None:
    # With asyncio.wait_for(..., 0) the endpoint never runs; asyncio.timeout(0) only
    # cancels at its first suspension, so an endpoint that decides without one (a memoised
    # claim admitted under this replica's lease: `Admitter.price_if_priced`, `Leases.take`)
    # would reserve and be allowed after the API server had given up on it: its create
    # fails, and the reservation is an orphan until the TTL.
    ran: list[str] = []

    async def decides_at_once(request: AdmissionRequest) -> Verdict:
        ran.append(request.uid)
        return Verdict(True)

    verdict = await _decide(decides_at_once, parse_review(REVIEW), -0.1)
    assert not verdict.allowed and verdict.cause == "timeout" and ran == []
