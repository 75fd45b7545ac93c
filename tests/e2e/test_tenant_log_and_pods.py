"""What a hostile tenant's long denials cost serve's log, and what its huge Pods cost serve's event loop.

On the real control plane, `dra-quota serve` behind the shipped webhook configurations
(adapted as tests/e2e/harness.py does), tenants the admin client impersonates, each bound
to the API server's own `edit` ClusterRole in a namespace of their own, each governed by
a DeviceQuota:
- mallory sends 300 dryRun claims of 32 requests x 8 subrequests, each naming a DeviceClass
  that does not exist: each is denied with a message of ~90,000 characters. serve's log
  (at its default level, info) grows by at most `LOG_BYTES_PER_DENIAL` a request
  (`runtime.logbounds` cuts each line, `webhook.decisionlog` samples a namespace's
  denials), and mallory, and alice beside her, still get the whole message;
- mallory sends dryRun Pods of 1,024 containers each asking 4 extended resources that
  DeviceClasses map, 8 in flight, while bob creates dryRun claims: every one of bob's
  creates is answered as it would be without mallory (allowed: it fits), every Pod is
  allowed (a Pod is only ever warned), and each Pod review serve answered went through
  the slicer's slow lane (serve's log says so at debug, once per call past its first
  slice): its reading gave the event loop back between slices instead of holding it whole.
The longest event loop stall serve measured goes to tests/e2e/timings.py, never asserted;
bench/attacks.py measures latencies and log bytes apart.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from runtime.metricnames import EVENT_LOOP_STALL_CPU_MAX

from .cluster import ControlPlane
from .driver import RESOURCE_V1, POD_IMAGE, Gpu
from .harness import RUN_LABEL, MakeFleet, MakeNamespace, Served, adapted_webhooks, installed, metered
from .kube import Kube, Obj
from .tenants import Tenants, governed_tenants
from .timings import record

pytestmark = pytest.mark.e2e

LOG_BYTES_PER_DENIAL = 4096  # the bound (docs/security.md)
DENIALS = 300
SUBREQUESTS = (32, 8)  # requests x subrequests of each denied claim
PODS_IN_FLIGHT, POD_ROUNDS = 8, 3
CONTAINERS, CLASSES = 1024, 4
SLOW_LANE = "pricing did not finish in its first slice: slow lane"  # runtime.slicing, at debug


async def tenants_of(cluster: ControlPlane, kube: Kube, served: Served, make_namespace: MakeNamespace,
                     make_fleet: MakeFleet, names: tuple[str, ...]) -> AsyncIterator[Tenants]:
    """Body of a fixture: `names`, each with `edit` in a namespace of their own governed by
    a DeviceQuota of `HARD`, and the webhooks pointing at `served`."""
    run = uuid.uuid4().hex[:8]
    fleet = await make_fleet("tenant")
    await fleet.add_node("n1", [Gpu()] * 4)
    namespaces = {f"{name}-{run}": await make_namespace(name, labels={RUN_LABEL: run}) for name in names}
    t = Tenants(kube, run, fleet, served, namespaces)
    async with installed(kube, adapted_webhooks(run, served.port, cluster)):
        await governed_tenants(t)
        yield t


# -- (a) the log -------------------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="session")
async def quiet(cluster: ControlPlane, crd: None, tmp_path: Path) -> AsyncIterator[Served]:
    """serve at its default log level, info, as the chart runs it."""
    async for handle in metered(cluster, tmp_path, log_level="info"):
        yield handle


@pytest_asyncio.fixture(loop_scope="session")
async def logged(cluster: ControlPlane, kube: Kube, quiet: Served, make_namespace: MakeNamespace,
                 make_fleet: MakeFleet) -> AsyncIterator[Tenants]:
    async for t in tenants_of(cluster, kube, quiet, make_namespace, make_fleet, ("alice", "mallory")):
        yield t


def missing_classes(run: str, salt: int) -> Obj:
    """A claim of 32 x 8 subrequests, each naming a DeviceClass nobody made (long names:
    each makes its own line of the denial)."""
    requests, subrequests = SUBREQUESTS

    def name(r: int, s: int) -> str:
        return f"missing-{run}-{salt}-{r}-{s}-" + "x" * 180

    return {"apiVersion": RESOURCE_V1, "kind": "ResourceClaim", "metadata": {"name": f"long-{salt}"},
            "spec": {"devices": {"requests": [
                {"name": f"r{r}", "firstAvailable": [{"name": f"s{s}", "deviceClassName": name(r, s)}
                                                     for s in range(subrequests)]}
                for r in range(requests)]}}}


def whole_denial(answer: str, run: str, salt: int) -> bool:
    """The API server's 403 with our whole message: every subrequest's missing class named."""
    requests, subrequests = SUBREQUESTS
    return (answer.startswith("403: ") and answer.count("not found") == requests * subrequests
            and f"missing-{run}-{salt}-{requests - 1}-{subrequests - 1}-" in answer)


async def test_a_flood_of_long_denials_costs_the_log_a_bounded_size_a_request(logged: Tenants, quiet: Served) -> None:
    t = logged
    before = quiet.log.stat().st_size
    answers: dict[int, str] = {}

    async def worker(first: int) -> None:
        for salt in range(first, DENIALS, 6):
            answers[salt] = await t.create("mallory", "resourceclaims", missing_classes(t.run, salt), dry_run=True)

    await asyncio.gather(*(worker(w) for w in range(6)))
    alice = {salt: await t.create("alice", "resourceclaims", missing_classes(t.run, salt), dry_run=True)
             for salt in range(DENIALS, DENIALS + 3)}
    grown = quiet.log.stat().st_size - before
    assert len(answers) == DENIALS
    bad = {salt: answer[:300] for salt, answer in (*answers.items(), *alice.items())
           if not whole_denial(answer, t.run, salt)}
    assert not bad, bad  # every tenant got the whole message
    assert grown <= LOG_BYTES_PER_DENIAL * (DENIALS + 3), (grown, quiet.log_text()[-3000:])
    # The flood crowded out nobody's lines: alice's denials are each logged.
    text = quiet.log_text()
    assert all(f" {t.ns('alice')}/long-{salt} uid=" in text for salt in alice), text[-3000:]
    assert "... [cut: " in text


# -- (b) the event loop ----------------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="session")
async def verbose(cluster: ControlPlane, crd: None, tmp_path: Path) -> AsyncIterator[Served]:
    """serve at debug: the slicer says when a call goes to the slow lane."""
    async for handle in metered(cluster, tmp_path, log_level="debug"):
        yield handle


@pytest_asyncio.fixture(loop_scope="session")
async def podded(cluster: ControlPlane, kube: Kube, verbose: Served, make_namespace: MakeNamespace,
                 make_fleet: MakeFleet) -> AsyncIterator[tuple[Tenants, list[str]]]:
    """bob and mallory, and `CLASSES` DeviceClasses each mapping an extended resource of its own."""
    async for t in tenants_of(cluster, kube, verbose, make_namespace, make_fleet, ("bob", "mallory")):
        resources = [f"e{t.run}.example.com/r{n}" for n in range(CLASSES)]
        names = [f"{t.fleet.prefix}-r{n}" for n in range(CLASSES)]
        for name, resource in zip(names, resources):
            await kube.create(RESOURCE_V1, "deviceclasses", {
                "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"extendedResourceName": resource, "selectors": [{"cel": {"expression": "true"}}]}})
        try:
            yield t, resources
        finally:
            for name in names:
                await kube.delete(RESOURCE_V1, "deviceclasses", name)


def huge_pod(n: int, resources: list[str]) -> Obj:
    asks = dict.fromkeys(resources, "1")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"huge-{n}"}, "spec": {
        "containers": [{"name": f"c{i}", "image": POD_IMAGE, "resources": {"limits": asks}} for i in range(CONTAINERS)],
        "terminationGracePeriodSeconds": 0}}


async def test_huge_pods_are_read_in_slices_while_another_tenant_creates(
    podded: tuple[Tenants, list[str]], verbose: Served
) -> None:
    t, resources = podded
    slow_before = verbose.log_text().count(SLOW_LANE)
    pods: list[str] = []
    creates: list[str] = []
    done = asyncio.Event()

    async def mallory(worker: int) -> None:
        for r in range(POD_ROUNDS):
            pods.append(await t.create("mallory", "pods", huge_pod(worker * 100 + r, resources), dry_run=True))

    async def bob() -> None:
        n = 0
        while not done.is_set() or n < 10:
            creates.append(await t.claim("bob", f"honest-{n}", dry_run=True))
            n += 1

    honest = asyncio.create_task(bob())
    try:
        await asyncio.gather(*(mallory(w) for w in range(PODS_IN_FLIGHT)))
    finally:
        done.set()
        await honest
    stall = (await verbose.metrics()).get((EVENT_LOOP_STALL_CPU_MAX, frozenset()), -1.0)
    record("longest event loop stall (serve's CPU) through the Pod flood", stall)
    assert pods == [""] * (PODS_IN_FLIGHT * POD_ROUNDS), pods  # a Pod is only ever warned
    assert creates and set(creates) == {""}, creates  # each fits: allowed, none failed or timed out
    # Each Pod review serve answered (its log says so at debug; a call the API server could
    # not make, failurePolicy Ignore, would leave a Pod allowed unseen) passed its first
    # slice and gave the loop back in the slow lane.
    text = verbose.log_text()
    answered = text.count(f"/validate allowed CREATE {t.ns('mallory')}/huge-")
    assert answered >= PODS_IN_FLIGHT * POD_ROUNDS // 2, text[-3000:]
    assert text.count(SLOW_LANE) - slow_before >= answered, text[-3000:]
