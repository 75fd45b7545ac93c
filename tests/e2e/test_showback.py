"""GPU-memory-hours end to end: two replicas, a real Prometheus, a leader change, `dra-quota report`.

Two `serve` replicas (a, b) share the webhook port (--reuse-port) and one Lease; a real
Prometheus (tests/e2e/prometheus.py, 1 s scrapes) scrapes both as the Prometheus Operator
scrapes the chart's ServiceMonitor (HTTPS, a token of the chart's metrics-reader role).
The real scheduler allocates one 80Gi GPU to one pod and two to another; replica a leads
while they run, then is stopped (SIGTERM: it releases the Lease) and b takes over; the
pods are then freed one after the other. The test watches the claims itself, so it knows
when each was allocated and gone (its watch and serve's see the same events), and
computes the true integral. `dra-quota report` over the range agrees with it within a
tolerance derived from the scrape interval and the hand-over the test observed, never
a duration asserted: both replicas' counters grew, and none counted a second twice (the
sum would be far above the integral).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from kube.resources import CLAIMS

from .cluster import ControlPlane, free_ports
from .driver import claim_spec, create_claim_template, create_pod, exact_request, free_pod, wait_pod_allocated
from .harness import Served, Setup, dra_quota, running
from .kube import Kube, poll
from .prometheus import Prometheus, as_the_operator_scrapes, chart_reader_token
from .timings import record

pytestmark = pytest.mark.e2e

GI = 1024**3
SCRAPE = 1.0  # seconds: tests/e2e/prometheus.py's scrape interval
MEMORY = "draquota_allocated_memory_byte_seconds_total"
HOLD = 12.0  # seconds of allocation each phase waits to see in Prometheus (a condition, not a sleep)


@pytest_asyncio.fixture(loop_scope="session")
async def served(cluster: ControlPlane, crd: None, tmp_path: Path) -> AsyncIterator[Served]:
    """Replica a: the webhook on a port b shares, metrics on its own; it leads first."""
    port, metrics_port = free_ports(2)
    async for handle in running(Served(cluster, port, tmp_path / "a.log", metrics_port=metrics_port,
                                       args=("--reuse-port",), log_level="info")):
        yield handle


class Claims:
    """When the test's own watch saw each claim of a namespace allocated, and gone."""

    def __init__(self) -> None:
        self.allocated: dict[str, tuple[float, int]] = {}  # name -> (time, bytes held)
        self.gone: dict[str, float] = {}

    async def follow(self, kube: Kube, namespace: str, opened: asyncio.Event) -> None:
        async for kind, obj in kube.api.watch(CLAIMS, namespace=namespace, opened=opened.set, silence=600):
            if kind == "BOOKMARK":
                continue
            name, now = obj["metadata"]["name"], time.time()
            if kind == "DELETED":
                self.gone.setdefault(name, now)
            elif (obj.get("status") or {}).get("allocation") and name not in self.allocated:
                results = obj["status"]["allocation"]["devices"]["results"]
                self.allocated[name] = (now, 80 * GI * len(results))

    async def both_gone(self, watcher: asyncio.Task[None]) -> bool:
        if watcher.done():
            watcher.result()  # what ended the watch
            raise AssertionError("the test's watch of the claims ended")
        return len(self.gone) == 2

    def integral(self) -> float:
        """Byte-seconds held, from what the watch saw."""
        return sum(held * (self.gone[name] - at) for name, (at, held) in self.allocated.items())


async def series(prometheus: Prometheus, expr: str) -> float:
    result = await prometheus.query(expr)
    return sum(float(s["value"][1]) for s in result)


async def leads(replica: Served) -> bool:
    metrics = await replica.metrics()
    return any(name == "draquota_leader" and value == 1 for (name, _), value in metrics.items())


async def test_report_over_a_leader_change_agrees_with_the_allocations_integral(
        cluster: ControlPlane, kube: Kube, setup: Setup, tmp_path: Path) -> None:
    ns, fleet, a = setup.namespace, setup.fleet, setup.served
    b = Served(cluster, a.port, tmp_path / "b.log", metrics_port=free_ports(1)[0], args=("--reuse-port",),
               lease=a.lease, log_level="info")
    token = tmp_path / "prometheus-token"
    token.write_text(await chart_reader_token(kube, a))
    scrape = as_the_operator_scrapes(token, cluster.ca_file)
    prometheus = Prometheus(tmp_path / "prometheus", {"dra-quota-a": f"127.0.0.1:{a.metrics_port}",
                                                      "dra-quota-b": f"127.0.0.1:{b.metrics_port}"},
                            jobs={"dra-quota-a": scrape, "dra-quota-b": scrape})
    claims, opened = Claims(), asyncio.Event()
    watcher = asyncio.create_task(claims.follow(kube, ns, opened))
    try:
        with a.log_on_failure(), b.log_on_failure():
            await b.start()
            assert await leads(a) and not await leads(b)
            await prometheus.start()
            await poll(lambda: both_up(prometheus), timeout=60, what="both replicas scraped")
            await asyncio.wait_for(opened.wait(), 30)
            start = time.time()

            # Phase 1, a leads: one pod with one GPU, one with two.
            await create_claim_template(kube, ns, "one", claim_spec(exact_request("gpu", fleet.device_class)))
            await create_claim_template(kube, ns, "two", claim_spec(exact_request("gpu", fleet.device_class,
                                                                                  count=2)))
            for pod, template in (("p1", "one"), ("p2", "two")):
                await create_pod(kube, ns, pod, template=template, node_selector=fleet.node_selector)
            for pod in ("p1", "p2"):
                await wait_pod_allocated(kube, ns, pod)
            held = 3 * 80 * GI  # bytes while both run
            await poll(lambda: until_accrued(prometheus, "dra-quota-a", ns, held * HOLD), timeout=120,
                       what=f"{HOLD}s of allocation accrued by replica a")

            # The leader change: a stops (releasing the Lease), b takes over.
            stopping = asyncio.create_task(a.terminate())
            handover = await hand_over(a, b)  # measured, never asserted: it widens the tolerance
            code, _ = await stopping
            assert code == 0
            await poll(lambda: until_accrued(prometheus, "dra-quota-b", ns, held * HOLD), timeout=120,
                       what=f"{HOLD}s of allocation accrued by replica b")

            # Phase 2, b leads: p1 goes, then p2.
            await free_pod(kube, ns, "p1")
            accrued = await series(prometheus, f'sum({MEMORY}{{job="dra-quota-b", namespace="{ns}"}})')
            await poll(lambda: until_accrued(prometheus, "dra-quota-b", ns, accrued + 2 * 80 * GI * HOLD / 2),
                       timeout=120, what="replica b accrued p2 alone")
            await free_pod(kube, ns, "p2")
            await poll(lambda: claims.both_gone(watcher), timeout=30, what="both claims gone in the test's watch")
            gone = max(claims.gone.values())
            # Prometheus has scraped b after the last claim went: the counters are final.
            await poll(lambda: scraped_after(prometheus, "dra-quota-b", gone + 2 * SCRAPE), timeout=60,
                       what="a scrape of b after the claims went")
            end = time.time()

            code, out, err = await dra_quota("report", "--prometheus", prometheus.url, "--from", iso(start),
                                             "--to", iso(end), "-o", "json")
            assert code == 0, err
            report = json.loads(out)
            code, by_model, err = await dra_quota("report", "--prometheus", prometheus.url, "--from", iso(start),
                                                  "--to", iso(end), "--by", "model", "-o", "json")
            assert code == 0, err
            per_replica = {job: await series(prometheus, f'sum(increase({MEMORY}{{job="{job}", namespace="{ns}"}}'
                                                         f'[{round(end - start)}s] @ {end:.3f}))')
                           for job in ("dra-quota-a", "dra-quota-b")}
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await prometheus.stop()
        await b.kill()

    assert set(claims.allocated) == set(claims.gone) and len(claims.allocated) == 2
    true = claims.integral() / GI / 3600  # GiB-hours
    # What no replica could report or Prometheus extrapolates: a scrape interval at each
    # series' start and end (a's, b's) and at the range's ends, the hand-over the test saw,
    # and a scrape interval at each allocation's edges (serve's watch and the test's).
    tolerance = held * (4 * SCRAPE + handover) / GI / 3600 + sum(
        2 * bytes_ * SCRAPE for _, bytes_ in claims.allocated.values()) / GI / 3600
    [row] = [r for r in report["rows"] if r["namespace"] == ns]
    record("showback: hand-over, a last seen leading to b first seen leading", handover)
    record("showback: report minus the true integral, in seconds of the peak allocation",
           (row["gpuMemoryGiBHours"] - true) * GI * 3600 / held)
    assert abs(row["gpuMemoryGiBHours"] - true) <= tolerance, (row, true, tolerance, handover)
    assert abs(row["deviceHours"] * 80 - true) <= tolerance, (row, true, tolerance)
    assert report["total"]["gpuMemoryGiBHours"] >= row["gpuMemoryGiBHours"]
    # Each replica counted its own part, and the parts add up (none counted a second twice).
    assert all(v > 0 for v in per_replica.values()), per_replica
    assert abs(sum(per_replica.values()) / GI / 3600 - true) <= tolerance, (per_replica, true)
    models = {r["model"]: r["gpuMemoryGiBHours"] for r in json.loads(by_model)["rows"]}
    assert models.get("NVIDIA A100-SXM4-80GB", 0) >= row["gpuMemoryGiBHours"] - tolerance, models


async def until_accrued(prometheus: Prometheus, job: str, namespace: str, byte_seconds: float) -> bool:
    return await series(prometheus, f'sum({MEMORY}{{job="{job}", namespace="{namespace}"}})') >= byte_seconds


async def both_up(prometheus: Prometheus) -> bool:
    return await series(prometheus, 'sum(up{job=~"dra-quota-a|dra-quota-b"})') == 2


async def hand_over(a: Served, b: Served, *, timeout: float = 60) -> float:
    """Seconds from the last time a was seen leading to the first time b was: the time
    nobody accrued lies inside (each replica's /metrics, looked at in turn)."""
    last_a, deadline = time.time(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, AssertionError, aiohttp.ClientError):
            if await leads(a):
                last_a = time.time()
        if await leads(b):
            return time.time() - last_a
        await asyncio.sleep(0.05)  # the interval between looks; the loop ends on b leading
    raise AssertionError(f"replica b did not lead within {timeout}s")


async def scraped_after(prometheus: Prometheus, job: str, when: float) -> bool:
    return await series(prometheus, f'max(timestamp(draquota_leader{{job="{job}"}}))') >= when


def iso(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).isoformat().replace("+00:00", "Z")
