"""A ClusterDeviceQuota holds a team of namespaces to one budget, on the real
control plane with `dra-quota serve`.

1. Three namespaces of one team, each with its own DeviceQuota too, create claims at once
   through two `serve` replicas on one port (`--reuse-port`, as tests/e2e/test_replicas.py
   runs them); one replica is SIGKILLed mid-burst. At every sample the team's persisted
   claims stay within the ClusterDeviceQuota's `hard`, each namespace's within its own;
   once the dead replica's orphaned reservations expire (the TTL), retried creates reach
   exactly floor(hard / charge) for the team, and the next is denied naming the
   ClusterDeviceQuota. The team status (totals and breakdown) matches what is persisted.
2. With a real Kueue and our AdmissionCheck: a Job of a namespace of a full team waits with
   the team's numbers; a claim of another namespace of the team going admits it.

Team membership is the label `team.draquota.io/name` (docs/team-quotas.md: only labels a
tenant cannot change may select a team). One replica's relabels, status breakdown,
Exceeded Event, deletion and the label policy are test_cluster_quota_smoke.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ..tools.chart import NAMESPACE
from .cluster import ControlPlane, free_ports
from .driver import RESOURCE_V1, Gpu, GpuFleet, claim_spec, exact_request
from .harness import (
    ADMISSION, CLIENTS, DQ, PLURALS, RUN_LABEL, MakeFleet, MakeNamespace, Served, adapted_webhooks,
    advised, create_until_decided, denial, governed, installed, running, unique,
)
from .kube import ApiError, Kube, Obj, poll
from .kueue import API, DEVICE_CLASS, NAMESPACE_LABEL, Kueue
from .queues import BATCH, CONTROLLER, MakeQueueObject, gpu_job, holds, queues, workload_of
from .shipped import LEASE, chart_kubeconfig

pytestmark = pytest.mark.e2e

TEAM_LABEL = "team.draquota.io/name"
CDQ_PLURAL = "clusterdevicequotas"
GPU_GIB = 80
H100 = Gpu("NVIDIA H100-SXM5-80GB", "80Gi")
TEAM_K = 30  # the team's hard, in 80Gi claims
OWN_K = 15  # each namespace's own DeviceQuota: three of them could hold 45 without the team's
PER_NAMESPACE = 120  # creates per namespace in the burst
TTL = 20.0  # short, so the killed replica's orphans expire within the test (test_replicas.py says why not 3 s)


def team_quota(name: str, team: str, gpus: int) -> Obj:
    return {"kind": "ClusterDeviceQuota", "metadata": {"name": name},
            "spec": {"namespaceSelector": {"matchLabels": {TEAM_LABEL: team}},
                     "hard": {"memory": f"{gpus * GPU_GIB}Gi"}}}


def own_quota(gpus: int) -> Obj:
    return {"kind": "DeviceQuota", "metadata": {"name": "own"}, "spec": {"hard": {"memory": f"{gpus * GPU_GIB}Gi"}}}


def claim(fleet: GpuFleet, name: str) -> Obj:
    return {"kind": "ResourceClaim", "metadata": {"name": name},
            "spec": claim_spec(exact_request("gpu", fleet.device_class, count=1))}


async def claims_in(kube: Kube, namespace: str) -> int:
    return len(await kube.list(RESOURCE_V1, "resourceclaims", namespace=namespace))


async def team_status(kube: Kube, name: str) -> Obj:
    status: Obj = (await kube.get(DQ, CDQ_PLURAL, name)).get("status") or {}
    return status


def gib(quantity: str) -> int:
    """'2400Gi' -> 2400, '0' -> 0 (the controller writes memory as Gi quantities here)."""
    return 0 if quantity in ("0", "") else int(quantity.removesuffix("Gi"))


def breakdown(status: Obj) -> dict[str, int]:
    """Namespace -> GiB reserved + used, from the status's per-namespace list."""
    return {item["namespace"]: gib(item["used"]["memory"]) + gib(item["reserved"]["memory"])
            for item in status.get("namespaces") or []}


@dataclass
class Tally:
    created: int = 0
    denied_by_team: int = 0
    denied_by_own: int = 0
    max_team: int = 0
    max_own: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # failures retried, by status and message


async def decide(client: Kube, fleet: GpuFleet, namespace: str, name: str, tally: Tally) -> None:
    """One create, retried until the webhooks decide (`harness.create_until_decided`), tallied."""
    denied = await create_until_decided(client, namespace, claim(fleet, name), tally.errors)
    if "exceeded ClusterDeviceQuota" in denied:
        tally.denied_by_team += 1
    elif denied:
        tally.denied_by_own += 1
    else:
        tally.created += 1


@contextlib.asynccontextmanager
async def sampled(kube: Kube, namespaces: list[str], tally: Tally) -> AsyncIterator[None]:
    """Sample what the API server holds while the body runs: the assertions are on the
    maxima (the team's total, and any one namespace's)."""
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            counts = [await claims_in(kube, ns) for ns in namespaces]
            tally.max_team = max(tally.max_team, sum(counts))
            tally.max_own = max(tally.max_own, *counts)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.05)

    task = asyncio.create_task(sample())
    try:
        yield
    finally:
        done.set()
        await task
    counts = [await claims_in(kube, ns) for ns in namespaces]
    tally.max_team, tally.max_own = max(tally.max_team, sum(counts)), max(tally.max_own, *counts)


async def test_a_team_burst_through_two_replicas_one_killed_never_over_commits(
        cluster: ControlPlane, kube: Kube, crd: None, clients: list[Kube], make_namespace: MakeNamespace,
        make_fleet: MakeFleet, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    team = f"t-{run}"
    fleet = await make_fleet("team")
    await fleet.add_node("n1", [Gpu()] * 4)
    namespaces = [await make_namespace("team", labels={RUN_LABEL: run, TEAM_LABEL: team}) for _ in range(3)]
    for ns in namespaces:
        await kube.create(DQ, "devicequotas", own_quota(OWN_K), namespace=ns)
    await kube.create(DQ, CDQ_PLURAL, team_quota(team, team, TEAM_K))
    port = free_ports(1)[0]
    args = ("--reuse-port", "--reservation-ttl", str(TTL))
    a = Served(cluster, port, tmp_path / "a.log", args=args)
    b = Served(cluster, port, tmp_path / "b.log", args=args, lease=a.lease)  # one leader between them
    configs: list[tuple[str, str]] = []
    tally = Tally()
    try:
        with a.log_on_failure(), b.log_on_failure():
            await a.start()
            for config in adapted_webhooks(run, port, cluster):
                await kube.create(ADMISSION, PLURALS[config["kind"]], config)
                configs.append((PLURALS[config["kind"]], config["metadata"]["name"]))
            # The leader has the team (its first status) and governs its namespaces.
            await kube.wait_for(DQ, CDQ_PLURAL, team, lambda q: (q.get("status") or {}).get("observedGeneration") == 1,
                                timeout=60, what="the team's first status")
            for ns in namespaces:
                await governed(kube, ns)
            await b.start()

            killed = asyncio.Event()

            async def one(i: int) -> None:
                ns = namespaces[i % 3]
                await decide(clients[i % CLIENTS], fleet, ns, f"c{i}", tally)
                if tally.created >= 4 and not killed.is_set():
                    killed.set()  # mid-burst: most admissions are still to come
                    await b.kill()

            started = time.monotonic()
            async with sampled(kube, namespaces, tally):
                await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(3 * PER_NAMESPACE))), 180)
            seconds = time.monotonic() - started
            assert killed.is_set()
            assert tally.max_team <= TEAM_K and tally.max_own <= OWN_K, tally
            held = sum([await claims_in(kube, ns) for ns in namespaces])

            # The dead replica's reservations expire; retried creates in the namespace with
            # the most room of its own then fill the team to exactly TEAM_K.
            late = [0]

            async def filled() -> bool:
                counts = {ns: await claims_in(kube, ns) for ns in namespaces}
                if sum(counts.values()) >= TEAM_K:
                    return True
                late[0] += 1
                await decide(kube, fleet, min(counts, key=lambda n: counts[n]), f"late{late[0]}", tally)
                return False

            async with sampled(kube, namespaces, tally):
                await poll(filled, timeout=TTL * 4, what=f"retried creates to fill the team to {TEAM_K}")
            counts = {ns: await claims_in(kube, ns) for ns in namespaces}
            assert sum(counts.values()) == TEAM_K and tally.max_team == TEAM_K and tally.max_own <= OWN_K, tally
            roomy = min(counts, key=lambda n: counts[n])
            assert counts[roomy] < OWN_K  # so only the team can refuse the next one
            message = await denial(kube.create(RESOURCE_V1, "resourceclaims", claim(fleet, "one-more"),
                                               namespace=roomy))
            assert f'exceeded ClusterDeviceQuota "{team}"' in message, message

            # The team's status: totals and the breakdown match what is persisted.
            def matches(q: Obj) -> bool:
                status = q.get("status") or {}
                total = gib((status.get("reserved") or {}).get("memory", "0")) + gib(
                    (status.get("used") or {}).get("memory", "0"))
                parts = breakdown(status)
                return total == TEAM_K * GPU_GIB and all(parts.get(ns) == counts[ns] * GPU_GIB for ns in namespaces)

            await kube.wait_for(DQ, CDQ_PLURAL, team, matches, timeout=60, what="team totals and breakdown")
            print(f"\nteam burst: {3 * PER_NAMESPACE} creates over 3 namespaces in {seconds:.1f}s through 2 replicas "
                  f"(one SIGKILLed); {held} claims when it ended, {late[0]} late attempts to reach {TEAM_K}; "
                  f"per namespace {sorted(counts.values())}; denied by the team {tally.denied_by_team}, by a "
                  f"namespace's own quota {tally.denied_by_own}; errors retried: {tally.errors}", file=sys.stderr)
    finally:
        for plural, name in reversed(configs):
            with contextlib.suppress(ApiError):
                await kube.delete(ADMISSION, plural, name)
        await a.kill()
        await b.kill()
        await kube.delete(DQ, CDQ_PLURAL, team)


async def test_a_kueue_workload_waits_for_its_full_team_and_is_admitted_when_another_namespace_frees_room(
        cluster: ControlPlane, kube: Kube, kueue: Kueue, crd: None, tmp_path: Path,
        make_namespace: MakeNamespace, make_fleet: MakeFleet, queue_objects: MakeQueueObject) -> None:
    """Kueue's ClusterQueue has room; the team does not: our AdmissionCheck holds the Job of
    one namespace with the team's numbers until a claim of another namespace of the team goes."""
    run = uuid.uuid4().hex[:8]
    team = f"t-{run}"
    fleet = await make_fleet("kteam")
    await fleet.add_node("n1", [H100] * 4)
    labels = {NAMESPACE_LABEL: "true", RUN_LABEL: run, TEAM_LABEL: team}
    a, b = [await make_namespace("kteam", labels=labels) for _ in range(2)]
    await kube.create(DQ, CDQ_PLURAL, team_quota(team, team, 2))
    check = (await queue_objects("admissionchecks", {
        "kind": "AdmissionCheck", "metadata": {"name": unique("ac")}, "spec": {"controllerName": CONTROLLER},
    }))["metadata"]["name"]
    cq, lq = await queues(kube, queue_objects, a, devices=6, checks=(check,))
    kubeconfig = await chart_kubeconfig(cluster, kube, tmp_path / "chart.kubeconfig")
    handle = Served(cluster, free_ports(1)[0], tmp_path / "serve.log", kubeconfig=kubeconfig,
                    args=("--kueue", "auto", "--kueue-retry-seconds", "2",
                          "--leader-election-namespace", NAMESPACE, "--leader-election-lease-name", LEASE))
    try:
        async for served in running(handle):
            async with installed(kube, adapted_webhooks(run, served.port, cluster)):
                with served.log_on_failure():
                    await kube.wait_for_condition(API, "clusterqueues", cq, "Active")
                    for ns in (a, b):
                        await governed(kube, ns)
                    # b's direct claim of 2 H100s fills the team.
                    await kube.create(RESOURCE_V1, "resourceclaims", {
                        "kind": "ResourceClaim", "metadata": {"name": "direct"},
                        "spec": claim_spec(exact_request("gpu", DEVICE_CLASS, count=2))}, namespace=b)
                    job = await gpu_job(kube, a, lq, devices=2)
                    name = (await workload_of(kube, job, holds("QuotaReserved"), "Kueue reserved"))["metadata"]["name"]
                    text = advised(f'exceeded ClusterDeviceQuota "{team}": requested memory=160Gi, used memory=0, '
                                   "reserved memory=160Gi, limited memory=160Gi", "reserved", namespace=a)

                    async def held() -> bool:
                        events = await kube.list("events.k8s.io/v1", "events", namespace=a)
                        return any(e.get("reason") == "DeviceQuotaExceeded" and e["regarding"]["name"] == name
                                   and text in e.get("note", "") for e in events)

                    await poll(held, timeout=60, what=f"our Event on {name} with the team's numbers")
                    suspended = await kube.get(BATCH, "jobs", job["metadata"]["name"], namespace=a)
                    assert suspended["spec"]["suspend"] is True
                    # The claim in the other namespace of the team goes: the Workload is admitted.
                    await kube.delete(RESOURCE_V1, "resourceclaims", "direct", namespace=b)
                    admitted = await workload_of(kube, job, holds("Admitted"), "Admitted once b's claim went",
                                                 timeout=90)
                    assert any(c["name"] == check and c["state"] == "Ready"
                               for c in admitted["status"]["admissionChecks"]), admitted["status"]
                    assert "HTTP 403" not in served.log_text()  # the chart's RBAC covers team quotas
    finally:
        await kube.delete(DQ, CDQ_PLURAL, team)
