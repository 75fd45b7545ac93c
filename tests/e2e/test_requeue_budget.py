"""What a tenant's waiting Pods may make the leader's requeue cost: a constant per request.

Two tenants, each an impersonated user bound to `edit` in a namespace of its own
(tests/e2e/tenants.py). The requeue (`controllers.requeue`) answers each deleted claim by
touching the ResourceClaimTemplates unscheduled Pods wait on, so the resourceclaim
controller retries them at once.

- Amplification: mallory parks Pods on TEMPLATES padded templates whose claims her quota
  denies, then creates and deletes a small claim CHURN times. serve's template writes in
  her namespace (the API server's audit log) stay at most 2 per deletion: one touch and
  its settle (the requeue used to touch every waiting template twice per pass: 60 for 30
  templates). They are counted once serve's requeue has been told of every deletion and
  owes no write (`draquota_requeue_credits_total`, `draquota_requeue_pending_writes`), or
  as soon as they exceed the bound. Meanwhile bob frees room for his own waiting Pod:
  serve touches his template and the Pod gets its claim.
- Memory: mallory parks FAT_PODS Pods of ~1 MB each on a template her quota denies, then
  frees room: serve's RSS grows by at most 200 MiB (the requeue used to list the
  namespace's unscheduled Pods whole, in pages of 500) and one of the Pods gets its claim.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from runtime.metricnames import EVENT_LOOP_STALL_MAX, REQUEUE_CREDITS, REQUEUE_PENDING, REQUEUE_WRITES

from .cluster import ControlPlane
from .driver import RESOURCE_V1, Gpu
from .harness import (
    DQ, RUN_LABEL, MakeFleet, MakeNamespace, Served, adapted_webhooks, edit_binding, governed, installed, metered,
    rss,
)
from .kube import Kube, Obj, poll
from .requeue_load import RssPeak, fat_pod, padded_template, template_writes
from .tenants import Tenants

pytestmark = pytest.mark.e2e

# bench/budget_requeue.py runs this module at the scale (200 templates, 28 deleted
# claims: 56 tenant requests; 260 fat Pods) and reads what each test reports.
AT_SCALE = os.environ.get("DRAQUOTA_REQUEUE_SCALE") == "issue"
REPORT = os.environ.get("DRAQUOTA_REQUEUE_REPORT")
TEMPLATES = 200 if AT_SCALE else 30  # mallory's waiting templates
TEMPLATE_PAD = 20 * 1024
CHURN = 28 if AT_SCALE else 10  # claims mallory creates and deletes
FAT_PODS = 260 if AT_SCALE else 150
FAT_POD_PAD = 1_000_000
RSS_GROWTH = 200 * 2**20


async def report(served: Served, **numbers: float) -> None:
    """Print what a test measured, with serve's longest event loop stall and the load; append it to REPORT."""
    numbers["stall_max_seconds"] = (await served.metrics())[(EVENT_LOOP_STALL_MAX, frozenset())]
    numbers["load_average_1m"] = os.getloadavg()[0]  # the machine is shared: stalls read against it
    print(f"\n{json.dumps(numbers)}")
    if REPORT:
        with open(REPORT, "a") as out:
            out.write(json.dumps(numbers) + "\n")


@pytest_asyncio.fixture(loop_scope="session")
async def served(cluster: ControlPlane, crd: None, tmp_path: Path) -> AsyncIterator[Served]:
    """serve with its metrics on (each test reports the longest event loop stall)."""
    async for handle in metered(cluster, tmp_path, log_level="info"):
        yield handle


@pytest_asyncio.fixture(loop_scope="session")
async def tenants(cluster: ControlPlane, kube: Kube, served: Served, make_namespace: MakeNamespace,
                  make_fleet: MakeFleet) -> AsyncIterator[Tenants]:
    """mallory (3 GPUs of quota) and bob (1 GPU), each `edit` in a namespace of their own."""
    run = uuid.uuid4().hex[:8]
    fleet = await make_fleet("requeue")
    await fleet.add_node("n1", [Gpu()] * 4)
    namespaces = {f"{name}-{run}": await make_namespace(name, labels={RUN_LABEL: run}) for name in ("mallory", "bob")}
    t = Tenants(kube, run, fleet, served, namespaces)
    async with installed(kube, adapted_webhooks(run, served.port, cluster)):
        for (user, namespace), hard in zip(namespaces.items(), ("240Gi", "80Gi")):
            await kube.create("rbac.authorization.k8s.io/v1", "rolebindings", edit_binding(user), namespace=namespace)
            await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                                   "spec": {"hard": {"memory": hard}}}, namespace=namespace)
            await governed(kube, namespace)
        for name in ("mallory", "bob"):
            async def enforced(name: str = name) -> bool:  # four GPUs never fit
                return 'exceeded DeviceQuota "gpus"' in await t.claim(name, "probe", count=4, dry_run=True)

            await poll(enforced, timeout=30, what=f"serve to enforce the DeviceQuota of {name}")
        yield t


async def claim_of(kube: Kube, namespace: str, pods: set[str]) -> Obj | None:
    """A claim the resourceclaim controller made for one of `pods`, once there is one."""
    for claim in await kube.list(RESOURCE_V1, "resourceclaims", namespace=namespace):
        if any(o.get("kind") == "Pod" and o.get("name") in pods for o in claim["metadata"].get("ownerReferences") or []):
            return claim
    return None


async def credits(served: Served) -> float:
    """The deletions serve's requeue was told of (one credit each)."""
    return (await served.metrics())[(REQUEUE_CREDITS, frozenset())]


async def owed(served: Served) -> float:
    """The template writes serve's requeue still owes: 0 once every credit is spent and settled."""
    return (await served.metrics())[(REQUEUE_PENDING, frozenset())]


async def written(cluster: ControlPlane, namespace: str, count: int = 1) -> bool:
    return len(template_writes(cluster, [namespace])) >= count


async def gone(kube: Kube, namespace: str, claim: str) -> None:
    await kube.wait_deleted(RESOURCE_V1, "resourceclaims", claim, namespace=namespace, timeout=30)


async def park(t: Tenants, name: str, template: Obj, pods: list[Obj]) -> None:
    """`name` creates `template` and `pods` using it, ten at a time."""
    assert await t.create(name, "resourceclaimtemplates", template) == ""
    for start in range(0, len(pods), 10):
        answers = await asyncio.gather(*(t.create(name, "pods", pod) for pod in pods[start:start + 10]))
        assert answers == [""] * len(answers)


async def test_a_claim_deleted_costs_at_most_two_template_writes_and_another_tenant_is_still_requeued(
        cluster: ControlPlane, kube: Kube, tenants: Tenants) -> None:
    t, mallory, bob = tenants, tenants.ns("mallory"), tenants.ns("bob")
    device_class, nodes = t.fleet.device_class, t.fleet.node_selector
    with t.served.log_on_failure():
        # bob: his one GPU held; his Pod waits on a template claim of one GPU.
        assert await t.claim("bob", "held") == ""
        await park(t, "bob", padded_template("one-gpu", device_class, count=1, pad=0),
                   [fat_pod("waiting", "one-gpu", nodes, pad=0)])
        # mallory: one GPU held, her Pods wait on templates of three (never fit while held).
        assert await t.claim("mallory", "held") == ""
        for i in range(TEMPLATES):
            await park(t, "mallory", padded_template(f"wait-{i}", device_class, count=3, pad=TEMPLATE_PAD),
                       [fat_pod(f"wait-{i}", f"wait-{i}", nodes, pad=0)])
        before = len(template_writes(cluster, [mallory]))
        granted = await credits(t.served)
        for i in range(CHURN):
            assert await t.claim("mallory", f"churn-{i}") == ""
            assert await t.request("mallory", "DELETE", f"/apis/{RESOURCE_V1}/namespaces/{mallory}/resourceclaims/churn-{i}") == ""
            await gone(kube, mallory, f"churn-{i}")
            if i == CHURN // 2:  # room for bob in the middle of mallory's churn
                assert await t.request("bob", "DELETE", f"/apis/{RESOURCE_V1}/namespaces/{bob}/resourceclaims/held") == ""

        # bob's requeue: serve touched his template and his Pod got its claim.
        await poll(lambda: claim_of(kube, bob, {"waiting"}), timeout=60, what="bob's waiting Pod's claim")
        await poll(lambda: written(cluster, bob), timeout=30, what="serve's write of bob's template")
        # Every deletion's credit spent and settled (serve's requeue owes nothing), unless
        # the writes are over the budget already.
        async def settled() -> bool:
            if len(template_writes(cluster, [mallory])) - before > 2 * CHURN:
                return True
            return await credits(t.served) >= granted + CHURN + 1 and await owed(t.served) == 0

        await poll(settled, timeout=120, what=f"serve's requeue of {CHURN + 1} deletions settled")
        writes = len(template_writes(cluster, [mallory])) - before
        metrics = await t.served.metrics()
        await report(t.served, test=1, templates=TEMPLATES, tenant_requests=2 * CHURN, serve_writes=writes,
                     serve_credits=metrics[(REQUEUE_CREDITS, frozenset())] - granted,
                     serve_writes_all_namespaces=metrics[(REQUEUE_WRITES, frozenset())],
                     writes_per_request=writes / (2 * CHURN), bytes_written=writes * TEMPLATE_PAD,
                     rss_mib=rss(t.served) / 2**20)
        assert writes <= 2 * CHURN


async def unpark(kube: Kube, namespace: str, pods: list[str]) -> None:
    """Delete `pods` ten at a time: the teardown's one collection delete would answer with
    every fat Pod in one body (260 MB), past the client's timeout."""
    for start in range(0, len(pods), 10):
        await asyncio.gather(*(kube.delete("v1", "pods", name, namespace=namespace, grace_period_seconds=0)
                               for name in pods[start:start + 10]))


async def test_fat_unscheduled_pods_do_not_blow_up_the_leaders_memory(cluster: ControlPlane, kube: Kube,
                                                                      tenants: Tenants) -> None:
    t, mallory = tenants, tenants.ns("mallory")
    try:
        await fat_pods_requeued(cluster, kube, t, mallory)
    finally:
        await unpark(kube, mallory, [f"fat-{i}" for i in range(FAT_PODS)])


async def fat_pods_requeued(cluster: ControlPlane, kube: Kube, t: Tenants, mallory: str) -> None:
    with t.served.log_on_failure():
        assert await t.claim("mallory", "held", count=2) == ""  # two GPUs of three
        pods = [fat_pod(f"fat-{i}", "two-gpus", t.fleet.node_selector, pad=FAT_POD_PAD) for i in range(FAT_PODS)]
        await park(t, "mallory", padded_template("two-gpus", t.fleet.device_class, count=2, pad=0), pods)
        del pods
        peak = RssPeak(t.served)
        peak.start()
        assert await t.request("mallory", "DELETE", f"/apis/{RESOURCE_V1}/namespaces/{mallory}/resourceclaims/held") == ""
        # The requeue still works: serve touched the template, and a Pod got its claim.
        await poll(lambda: written(cluster, mallory), timeout=60, what="serve's write of the template")
        claim = await poll(lambda: claim_of(kube, mallory, {f"fat-{i}" for i in range(FAT_PODS)}), timeout=60,
                           what="a fat Pod's claim")
        growth = await peak.stop()
        await report(t.served, test=2, fat_pods=FAT_PODS, pod_bytes=FAT_POD_PAD, rss_growth_mib=growth / 2**20,
                     rss_mib=rss(t.served) / 2**20, claim_created=bool(claim))
        assert growth <= RSS_GROWTH
