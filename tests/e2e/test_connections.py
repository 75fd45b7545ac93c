"""`dra-quota serve`'s transport against the real 1.37 API server and real sockets.

- Reviews of claims carrying 16–100 KB annotations reach us in many TLS records; each
  is answered by our handlers (the mutating webhook's annotations come back, a claim
  over the quota gets our message), never a failed call (HTTP 500 from the API server).
- `/metrics` is HTTPS and asks the API server: no token or a token it does not accept is
  401, a ServiceAccount without the right is 403, one bound to the chart's
  `dra-quota-metrics-reader` ClusterRole reads the metrics (200). Plain HTTP gets nothing.
- Thousands of idle and slow connections (tests/e2e/attack.py: TCP only, TLS only,
  slowloris headers, slow bodies, each re-opened when dropped) take at most the cap's
  worth of memory, and claim creates through the API server keep being answered
  meanwhile. The bound asserted: serve's RSS grows by at most `PER_CONNECTION` a slot of
  `--max-connections` (measured: about 80 KiB a connection; before the cap, 300 KiB each
  and no limit). bench/connections.py runs 10,000 and prints latency and RSS.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from devcluster.served import metrics_reader_token, service_account_token
from runtime.metricnames import CONNECTIONS, CONNECTIONS_DROPPED, EVENT_LOOP_STALL_MAX

from ..tools.chart import MANIFEST, documents, find
from .attack import Attack, attack
from .cluster import ControlPlane
from .driver import RESOURCE_V1, claim_spec, exact_request
from .harness import Served, Setup, advised, capped, make_quota, rss, served_context
from .kube import ApiError, Kube, poll

pytestmark = pytest.mark.e2e

CAP = 300
ATTACKERS = 1500
PER_CONNECTION = 256 * 1024  # bytes of RSS a connection slot may cost, asserted


@pytest_asyncio.fixture(loop_scope="session")
async def served(cluster: ControlPlane, crd: None, tmp_path: Path) -> AsyncIterator[Served]:
    # The attack comes from ::1, the API server from 127.0.0.1: a Pod's address is never
    # the API server's (webhook.connections evicts a hog's connections first).
    async for handle in capped(cluster, tmp_path, CAP, also=("--bind-address", "127.0.0.1,::1")):
        yield handle


def padded_claim(setup: Setup, name: str, size: int, count: int = 1) -> dict[str, object]:
    return {"kind": "ResourceClaim",
            "metadata": {"name": name, "annotations": {"example.com/padding": "x" * size}},
            "spec": claim_spec(exact_request("gpu", setup.fleet.device_class, count=count))}


async def outcome(kube: Kube, setup: Setup, name: str, size: int, count: int = 1) -> str:
    """"admitted", or the API server's message. The namespace holds a DeviceQuota, so its
    claims go to the fail-closed webhook: admitted means our webhook answered allowed (an
    unanswered or unreadable call would be a failed create, "failed calling webhook")."""
    try:
        await kube.create(RESOURCE_V1, "resourceclaims", padded_claim(setup, name, size, count),
                          namespace=setup.namespace, dry_run=True)
    except ApiError as err:
        return f"{err.status}: {err.message}"
    return "admitted"


async def test_reviews_of_claims_with_16_to_100_kb_annotations_are_all_answered_by_us(kube: Kube,
                                                                                         setup: Setup) -> None:
    with setup.served.log_on_failure():
        await make_quota(kube, setup, "gpus", "160Gi")  # two of the fleet's 80Gi GPUs
        sizes = random.Random(15).sample(range(16 * 1024, 100 * 1024), 40)
        outcomes = [await outcome(kube, setup, f"pad-{i}", size, count=4 if i % 5 == 0 else 1)
                    for i, size in enumerate(sizes)]
        denied = advised('403: admission webhook "quota.resourceclaims.draquota.io" denied the request: exceeded '
                         'DeviceQuota "gpus": requested memory=320Gi, used memory=0, reserved memory=0, limited '
                         'memory=160Gi', "never", namespace=setup.namespace)
        expected = [denied if i % 5 == 0 else "admitted" for i in range(len(sizes))]
        assert outcomes == expected


# -- /metrics -----------------------------------------------------------------------------------


async def scrape(served: Served, token: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    context = served_context(served)
    async with aiohttp.ClientSession() as http, http.get(f"https://127.0.0.1:{served.metrics_port}/metrics",
                                                         headers=headers, ssl=context) as resp:
        return resp.status, await resp.text()


async def test_metrics_are_for_tokens_the_api_server_allows_to_get_them(cluster: ControlPlane, kube: Kube,
                                                                        served: Served) -> None:
    with served.log_on_failure():
        reader = find(documents(MANIFEST.read_text()), "ClusterRole", "dra-quota-metrics-reader")
        try:
            await kube.create("rbac.authorization.k8s.io/v1", "clusterroles", reader)
        except ApiError as err:
            if err.status != 409:
                raise
        suffix = uuid.uuid4().hex[:6]
        allowed = await metrics_reader_token(cluster, account=f"scraper-{suffix}", role="dra-quota-metrics-reader")
        nobody = await service_account_token(cluster, account=f"nobody-{suffix}")
        assert (await scrape(served, None))[0] == 401
        assert (await scrape(served, "not-a-token"))[0] == 401
        status, body = await scrape(served, nobody)
        assert status == 403 and f"nobody-{suffix} may not get /metrics" in body, (status, body)
        status, body = await scrape(served, allowed)
        assert status == 200, (status, body)
        for name in (EVENT_LOOP_STALL_MAX, CONNECTIONS, CONNECTIONS_DROPPED):
            assert f"# TYPE {name} " in body, name
        with pytest.raises(aiohttp.ClientError):  # the port speaks TLS only
            async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{served.metrics_port}/metrics"):
                pass


# -- idle and slow connections ------------------------------------------------------------------


async def test_idle_and_slow_connections_take_at_most_the_caps_memory_and_creates_go_on(kube: Kube,
                                                                                         setup: Setup) -> None:
    served = setup.served
    with served.log_on_failure():
        await make_quota(kube, setup, "gpus", "160Gi")
        assert await outcome(kube, setup, "before", 1024) == "admitted"  # the API server's connections are open
        before, peak = rss(served), 0
        stop, report = asyncio.Event(), Attack()
        attacking = asyncio.create_task(attack(served.port, ATTACKERS, stop, ramp=500, reopen=5, report=report,
                                                host="::1"))

        async def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, rss(served))
                await asyncio.sleep(0.2)  # sampling period

        sampling = asyncio.create_task(sample())
        try:
            async def every_worker_opened() -> bool:
                return sum(report.opened.values()) >= ATTACKERS and report.peak_open >= CAP

            await poll(every_worker_opened, timeout=120, what=f"the attack to open {ATTACKERS} connections")
            outcomes = [await outcome(kube, setup, f"during-{i}", 1024) for i in range(20)]
        finally:
            stop.set()
            await asyncio.gather(attacking, sampling)
        print(f"serve RSS {before / 2**20:.0f} MiB before, peak {peak / 2**20:.0f} MiB during; {report.line()}")
        assert outcomes == ["admitted"] * 20
        assert sum(report.dropped.values()) >= ATTACKERS - CAP, report.line()
        assert peak - before <= CAP * PER_CONNECTION, (before, peak, report.line())
        metrics = await served.metrics()
        # At the cap the flood's new connections evict its own, or past the hog's budget
        # are refused at the accept (webhook.connections).
        made_room_or_refused = {reason: metrics.get((CONNECTIONS_DROPPED, frozenset({("listener", "webhook"),
                                                                                     ("reason", reason)})), 0.0)
                                for reason in ("evicted", "refused")}
        assert sum(made_room_or_refused.values()) >= ATTACKERS - CAP, made_room_or_refused
