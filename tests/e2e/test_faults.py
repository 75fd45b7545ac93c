"""Faults under a steady load of claim creates (tests/e2e/faults.py): a frozen leader, an
API server restart, an etcd compaction. Outcomes only; the times go to the e2e timings
record (tests/e2e/timings.py), the full-size numbers to bench/faults.py.

A frozen leader: replica A (the controller only, `--no-webhook`, so every write in its log
is a leader's) leads with a short Lease; B serves the webhooks and campaigns. A has a
backlog of claim patches (600 claims created where our webhooks do not run, so without
our charge, and another policy webhook that takes a second for each claim UPDATE): its
64 writers hold every connection of its pool and more patches wait for one. A is
SIGSTOPped, stays stopped past its Lease until B leads and has written, creates go on,
then A gets SIGCONT: it must send no write but its Lease's from then on, and nothing is
over-committed at any resourceVersion the quota watch saw: the API server's audit log,
A running as an identity of its own, has no write of A's received after the SIGCONT.
Without the gate asked as each write is sent (`kube.writegate.WRITE_GATE`), a patch that waited
for a connection, or for aiohttp's task that writes the request, is sent after A wakes
(one in the run on the code before the gate), as the Lease's new holder writes the same
claims; with it, A's log shows the ones it refused (4 in a run).

An API server restart and a compaction, on a control plane of their own (both would
break every other test's watches): one replica serving and leading, the load running,
kube-apiserver SIGKILLed and started again on the same etcd and port (readiness drops
and comes back; the watches reconnect), then etcd compacted to its current revision
while the load runs (the watches get 410 Gone and relist). After each: 0 over-commit at
any watched resourceVersion, every quota's status equal to the claims, no reservation
left behind once the TTL passed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from kube.api import KubeApi
from runtime.metricnames import WATCH_RELISTS, WATCH_RESTARTS

from . import timings
from .cluster import ControlPlane, free_ports, private_cluster
from .driver import RESOURCE_V1, Gpu, claim_spec, exact_request
from .faults import (
    LARGE, Load, audited_writes_after, device_quota, mismatches, overcommit, own_identity, own_tenants, running,
    sampled, tenants, until, watching, writes_sent_after,
)
from .harness import DQ, MakeFleet, MakeNamespace, Served, adapted_webhooks, claim_webhook, governed, installed
from .kube import Kube, Obj, poll

pytestmark = pytest.mark.e2e

NAMESPACES = 20
FULL = 5  # namespaces whose quota fills under the load
SMALL = 8
TTL = 20.0  # --reservation-ttl: an orphan of a create cut by the fault expires within the test
LEASE = ("--leader-election-lease-duration", "4", "--leader-election-renew-deadline", "3",
         "--leader-election-retry-period", "1")
APPLIED_WRITE = "appliedclusterdevicequotas/"
SLOW_LABEL = "e2e.draquota.io/slow"
SLOW = 1.0  # seconds the slow policy takes for each claim UPDATE
BACKLOG = 600  # claims for the leader to patch: more than its writers (64) and its connections (64)
IN_FLIGHT = 32


def lease_args(name: str) -> tuple[str, ...]:
    return ("--leader-election-namespace", "default", "--leader-election-lease-name", name, *LEASE)


async def holds(kube: Kube, lease: str, identity: str) -> bool:
    obj = await kube.get("coordination.k8s.io/v1", "leases", lease, namespace="default")
    return bool((obj.get("spec") or {}).get("holderIdentity") == identity)


def tail(served: Served, mark: int) -> str:
    return served.log_text()[mark:]


async def slow_policy(_request: Obj) -> Obj:
    """Another policy webhook on claim UPDATEs, a slow one."""
    await asyncio.sleep(SLOW)  # the webhook's own slowness, what the test needs: no synchronisation
    return {"allowed": True}


async def unadmitted(kube: Kube, make_namespace: MakeNamespace, clients: list[Kube], run: str,
                     device_class: str) -> tuple[str, Callable[[], Awaitable[int]]]:
    """A namespace with a DeviceQuota that our webhooks do not serve (no `run` label), so
    its claims arrive without our charge and the leader patches each (through the slow
    policy); and how to create BACKLOG claims there, IN_FLIGHT at a time."""
    namespace = await make_namespace("unadmitted", {SLOW_LABEL: run})
    await kube.create(DQ, "devicequotas", device_quota(LARGE, device_class), namespace=namespace)

    async def create_all() -> int:
        slots = asyncio.Semaphore(IN_FLIGHT)

        async def one(i: int) -> None:
            async with slots:
                await clients[i % len(clients)].create(RESOURCE_V1, "resourceclaims", {
                    "kind": "ResourceClaim", "metadata": {"name": f"u-{i}"},
                    "spec": claim_spec(exact_request("gpu", device_class))}, namespace=namespace)

        await asyncio.gather(*(one(i) for i in range(BACKLOG)))
        return BACKLOG

    return namespace, create_all


async def test_a_leader_frozen_past_its_lease_writes_nothing_once_it_wakes(
        cluster: ControlPlane, kube: Kube, crd: None, clients: list[Kube], make_namespace: MakeNamespace,
        make_fleet: MakeFleet, tmp_path: Path) -> None:
    fleet = await make_fleet("frozen")
    await fleet.add_node("n1", [Gpu()] * 2)
    run = uuid.uuid4().hex[:8]
    t = await tenants(kube, make_namespace, fleet.device_class, run=run, count=NAMESPACES, full=FULL, small=SMALL,
                      team=True)
    lease = f"frozen-{run}"
    port, b_port = free_ports(2)
    kubeconfig, user = await own_identity(cluster, kube, f"frozen-a-{run}", tmp_path / "a.kubeconfig")
    a = Served(cluster, 0, tmp_path / "a.log", webhook=False, kubeconfig=kubeconfig, args=lease_args(lease))
    b = Served(cluster, b_port, tmp_path / "b.log", args=(*lease_args(lease), "--reservation-ttl", str(TTL)))
    api = await KubeApi.from_kubeconfig(str(cluster.kubeconfig))
    load = Load(clients, t)
    backlog, create_backlog = await unadmitted(kube, make_namespace, clients, run, fleet.device_class)
    try:
        with a.log_on_failure(), b.log_on_failure():
            await a.start()
            await poll(lambda: holds(kube, lease, "a"), timeout=30, what="A to lead")
            await b.start()
            async with installed(kube, adapted_webhooks(run, b_port, cluster)), watching(api, t) as watch:
                for namespace in t.namespaces:
                    await governed(kube, namespace)
                async with running(load), claim_webhook(cluster, kube, f"slow-{run}", "UPDATE", slow_policy,
                                                         {SLOW_LABEL: run}):
                    await until(lambda: load.admitted >= 100, timeout=60, what="100 claims admitted")
                    # A's backlog of claims to patch, each patch held SLOW by the policy: its
                    # writers take every connection of its pool and more wait for one.
                    await create_backlog()
                    patch = f"PATCH /apis/resource.k8s.io/v1/namespaces/{backlog}/resourceclaims/"
                    await until(lambda: patch in a.log_text(), timeout=60, what="A to patch the backlog's claims")
                    assert a.process is not None
                    os.kill(a.process.pid, signal.SIGSTOP)
                    mark = len(a.log_text())
                    stopped_at = time.monotonic()
                    await poll(lambda: holds(kube, lease, "b"), timeout=60, what="B to take the Lease over")
                    took_over = time.monotonic() - stopped_at
                    # Short of the 30 s a request may take in all (queued included): a write that
                    # waited for a connection past it times out on waking instead of being sent.
                    await until(lambda: APPLIED_WRITE in b.log_text().partition("leading: Lease")[2], timeout=60,
                                what="B to write as the leader")
                    created = load.admitted
                    await until(lambda: load.admitted >= created + 20, timeout=60, what="20 more claims under B")
                    assert a.process is not None
                    woke_at = time.time()
                    os.kill(a.process.pid, signal.SIGCONT)
                    # A wakes, steps down and campaigns: its Lease read after "stopped leading"
                    # comes after its work was cancelled, so nothing of A's old round is left.
                    await until(lambda: campaigned(tail(a, mark), lease), timeout=60,
                                what="A to step down and read the Lease again")
                    created = load.admitted
                    await until(lambda: load.admitted >= created + 50, timeout=60, what="50 more claims after A woke")
                woke = tail(a, mark)

                async def exact() -> bool:
                    return not await mismatches(kube, t)

                await poll(exact, timeout=TTL + 60, what=f"every status to equal the claims: {await mismatches(kube, t)}")
                worst, seen = watch.worst, watch.events
    finally:
        if a.process is not None and a.process.poll() is None:
            os.kill(a.process.pid, signal.SIGCONT)
        await a.kill()
        await b.kill()
        await api.close()
        await kube.delete("rbac.authorization.k8s.io/v1", "clusterrolebindings", f"frozen-a-{run}")
        await kube.delete("v1", "serviceaccounts", f"frozen-a-{run}", namespace="default")
        if t.team:  # cluster-scoped: the namespaces' cleanup does not take it, and other tests list them all
            await kube.delete(DQ, "clusterdevicequotas", t.team)
    timings.record("frozen leader: Lease taken over after SIGSTOP", took_over)
    refused = woke.count("NotLeading")  # the writes its gate stopped
    print(f"\nfrozen leader: {load.summary()}; B led {took_over:.1f} s after the stop; A's writes refused by its "
          f"gate on waking: {refused}; worst used+reserved-hard over {seen} quota statuses: {worst}", file=sys.stderr)
    assert audited_writes_after(cluster, user, woke_at) == []
    assert writes_sent_after(woke, woke_at) == []
    assert worst <= 0 and await overcommit(kube, t) <= 0


def campaigned(log: str, lease: str) -> bool:
    stopped = log.find("stopped leading")
    return stopped >= 0 and f"GET /apis/coordination.k8s.io/v1/namespaces/default/leases/{lease} ->" in log[stopped:]


@dataclass
class Counts:
    restarts: float
    relists: float


async def watch_counts(served: Served) -> Counts:
    scraped = await served.metrics()
    return Counts(sum(v for (name, _), v in scraped.items() if name == WATCH_RESTARTS),
                  sum(v for (name, _), v in scraped.items() if name == WATCH_RELISTS))


@pytest_asyncio.fixture(loop_scope="session")
async def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ControlPlane]:
    """A control plane of this test's own, without the API server's watch cache: a watch
    that reconnects is then served from etcd's history, so a restart alone resumes every
    watch where it was, and only a compaction makes the API server answer 410 Gone."""
    with private_cluster(tmp_path_factory.mktemp("minik8s-faults"), {"apiserver": ("--watch-cache=false",)}) as cp:
        yield cp


async def test_an_api_server_restart_and_a_compaction_under_load_lose_nothing(
        own_cluster: ControlPlane, tmp_path: Path) -> None:
    cp = own_cluster
    run = uuid.uuid4().hex[:8]
    port, metrics_port = free_ports(2)
    served = Served(cp, port, tmp_path / "serve.log", metrics_port=metrics_port,
                    args=("--reservation-ttl", str(TTL), *lease_args(f"faults-{run}")))
    api = await KubeApi.from_kubeconfig(str(cp.kubeconfig))
    async with cp.client() as kube, cp.client() as other:
        t = await own_tenants(kube, run=run, count=NAMESPACES // 2, full=FULL // 2, small=SMALL)
        load = Load([kube, other], t)
        try:
            with served.log_on_failure():
                await served.start()
                async with installed(kube, adapted_webhooks(run, port, cp)), watching(api, t) as watch, \
                        sampled(served) as readiness:
                    for namespace in t.namespaces:
                        await governed(kube, namespace)
                    async with running(load):
                        await until(lambda: load.admitted >= 100, timeout=60, what="100 claims admitted")
                        before = await watch_counts(served)
                        killed = time.monotonic()
                        apiserver_back = await asyncio.to_thread(cp.restart_apiserver)
                        await until(lambda: readiness.ready_again(killed) is not None, timeout=120,
                                    what="serve's readiness to drop and come back")
                        back = readiness.ready_again(killed)
                        assert back is not None
                        created = load.admitted
                        await until(lambda: load.admitted >= created + 100, timeout=60,
                                    what="100 claims admitted after the restart")
                        restarted = await watch_counts(served)

                        # Compacted while the API server is down: every watch comes back
                        # from a resourceVersion etcd no longer has.
                        killed_again = time.monotonic()
                        await asyncio.to_thread(cp.restart_apiserver, while_down=cp.compact_etcd)
                        await until(lambda: readiness.ready_again(killed_again) is not None, timeout=120,
                                    what="serve's readiness to come back after the compaction")
                        created = load.admitted
                        await until(lambda: load.admitted >= created + 100, timeout=60,
                                    what="100 claims admitted after the compaction")
                        compacted = await watch_counts(served)

                    async def exact() -> bool:
                        return not await mismatches(kube, t)

                    await poll(exact, timeout=TTL + 60,
                               what=f"every status to equal the claims: {await mismatches(kube, t)}")
                    worst, seen = watch.worst, watch.events
                    over = await overcommit(kube, t)
        finally:
            await served.kill()
            await api.close()
    timings.record("API server restart: serve ready again after the kill", back - killed)
    print(f"\nAPI server restart and compaction: {load.summary()}; the API server ready {apiserver_back:.1f} s after "
          f"its kill, serve {back - killed:.1f} s; watch restarts/relists: restart +{restarted.restarts - before.restarts:g}"
          f"/+{restarted.relists - before.relists:g}, compaction +{compacted.restarts - restarted.restarts:g}"
          f"/+{compacted.relists - restarted.relists:g}; worst used+reserved-hard over {seen} quota statuses: {worst}",
          file=sys.stderr)
    assert restarted.restarts > before.restarts  # the watches were cut and resumed
    assert compacted.relists > restarted.relists  # 410 Gone: listed again
    assert worst <= 0 and over <= 0
