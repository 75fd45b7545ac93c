"""A tenant sees its team's budget in its own namespace, and nothing of the other members:
AppliedClusterDeviceQuotas on the real API server, written by one `dra-quota serve`.

A team of two namespaces under one ClusterDeviceQuota (test_cluster_quota_smoke.py's
fixture), one claim in each. A ServiceAccount bound to the built-in `view` in the first
namespace (the shipped dra-quota-view ClusterRole aggregated into it) reads, with kubectl
and with `dra-quota top -n`, the team's hard, totals and headroom and its own namespace's
part; it may not read the other namespace's copy nor the ClusterDeviceQuota, and its copy
names no other member. The second namespace relabelled out of the team loses its copy, and
the first's totals follow.

And what a tenant's claims cost: in a team of four namespaces, five claim events in one
write that namespace's copy (reason `own`) each, and the other three only when the refresh
period (10 s here, `--team-totals-refresh-period`) allows (`refresh`), at most once per
period each, however many events; counted by the metric draquota_applied_quota_writes_total
and named one by one in serve's debug log.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from runtime.metricnames import APPLIED_QUOTA_WRITES

from .cluster import ControlPlane
from .driver import RESOURCE_V1
from .harness import DQ, RUN_LABEL, MakeNamespace, Served, governed, metered, top
from .kube import Kube, Obj, poll
from .kubectl import Kubectl, KubectlError
from .test_cluster_quota_smoke import TEAM_LABEL, Team, create, team  # noqa: F401 (the fixture)
from .test_tenant_rbac import RBAC, binding, shipped, tenant_kubeconfig

pytestmark = pytest.mark.e2e

ACDQ = "appliedclusterdevicequotas"
REFRESH = 10  # seconds: the team totals' refresh period of this module's serve
REASONS = ("own", "refresh", "spec", "delete")
# controllers.applied's debug line for each write that landed, in the order it counts them.
WROTE = re.compile(r"(?:wrote|deleted) AppliedClusterDeviceQuota ([^/\s]+)/(\S+) \((\w+)\)")


@pytest_asyncio.fixture(loop_scope="session")
async def served(cluster: ControlPlane, crd: None, tmp_path: Path) -> AsyncIterator[Served]:
    """A short refresh period (the team fixture's serve), metrics on, debug log."""
    async for handle in metered(cluster, tmp_path, "--team-totals-refresh-period", str(REFRESH)):
        yield handle


async def writes(served: Served) -> Counter[str]:
    """draquota_applied_quota_writes_total by reason, one scrape."""
    samples = await served.metrics()
    return Counter({reason: int(samples.get((APPLIED_QUOTA_WRITES, frozenset({("reason", reason)})), 0))
                    for reason in REASONS})


def written_since(served: Served, before: int) -> list[tuple[str, str]]:
    """(namespace, reason) of each copy write after the first `before` the log names."""
    return [(ns, reason) for ns, _, reason in WROTE.findall(served.log_text())[before:]]


async def applied(kube: Kube, namespace: str, name: str) -> Obj | None:
    return await kube.get_or_none(DQ, ACDQ, name, namespace=namespace)


async def test_a_view_tenant_sees_its_teams_budget_and_its_own_part_only(
        cluster: ControlPlane, kube: Kube, kubectl: Kubectl, team: Team, tmp_path: Path) -> None:  # noqa: F811
    t = team
    run = uuid.uuid4().hex[:8]
    role = shipped("ClusterRole", "dra-quota-view")
    role["metadata"]["name"] = f"dra-quota-view-{run}"
    await kube.create(RBAC, "clusterroles", role)
    try:
        await kube.create("v1", "serviceaccounts", {"kind": "ServiceAccount", "metadata": {"name": "viewer"}},
                          namespace=t.a)
        await kube.create(RBAC, "rolebindings", binding("RoleBinding", "viewer", "view",
                                                        {"kind": "ServiceAccount", "name": "viewer",
                                                         "namespace": t.a}), namespace=t.a)
        who = f"--as=system:serviceaccount:{t.a}:viewer"
        with t.served.log_on_failure():
            await create(kube, t, t.a, "mine")
            await create(kube, t, t.b, "theirs")

            async def counted() -> Obj | None:  # the aggregation controller folds the role into view
                try:
                    out = await kubectl("get", "acdq", "-n", t.a, "-o", "json", who)
                except KubectlError:
                    return None
                items: list[Obj] = json.loads(out)["items"]
                # Both claims counted: a reservation is in the team's status as the claim is
                # admitted, its claim count once serve's watch has the claim.
                seen = [((i.get("status") or {}).get("reserved", {}).get("memory"),
                         (i.get("status") or {}).get("claims", {}).get("pending")) for i in items]
                return items[0] if seen == [("160Gi", 2)] else None

            mine: Obj = await poll(counted, timeout=60, what="the viewer to read its team's copy with both claims")
            assert mine["metadata"]["name"] == t.name
            status = mine["status"]
            assert status["hard"] == {"memory": "160Gi"} and status["headroom"] == {"memory": "0"}
            assert status["reserved"] == {"memory": "160Gi", "devices": 2}
            assert status["claims"] == {"allocated": 0, "pending": 2}
            assert status["namespace"] == {"name": t.a, "used": {"memory": "0", "devices": 0},
                                           "reserved": {"memory": "80Gi", "devices": 1},
                                           "claims": {"allocated": 0, "pending": 1}}
            assert t.b not in json.dumps(mine)  # nothing of the other member
            owner, = mine["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"]) == ("ClusterDeviceQuota", t.name)
            # The printer columns: the team's numbers and this namespace's part.
            table = await kubectl("get", "acdq", "-n", t.a, who)
            header, row = table.splitlines()
            assert header.split() == ["NAME", "HARD", "MEMORY", "USED", "MEMORY", "RESERVED", "MEMORY", "HEADROOM",
                                      "NS", "USED", "NS", "RESERVED", "AGE"], table
            assert row.split()[:7] == [t.name, "160Gi", "0", "160Gi", "0", "0", "80Gi"], table
            assert max(len(line) for line in table.splitlines()) <= 120, table
            # Not the other member's copy, not the team quota, not a write.
            for forbidden in (("get", "acdq", "-n", t.b), ("get", "clusterdevicequotas"),
                              ("delete", "acdq", t.name, "-n", t.a, "--dry-run=server")):
                with pytest.raises(KubectlError, match="[Ff]orbidden"):
                    await kubectl(*forbidden, who)

            code, out, err = await top("--kubeconfig", str(await tenant_kubeconfig(cluster, tmp_path, t.a, "viewer")),
                                       "-n", t.a, "-o", "json")
            assert (code, err) == (0, ""), err
            (row_json,) = json.loads(out)["quotas"]
            gi = 1024**3
            assert row_json.pop("refreshSeconds") == REFRESH and row_json.pop("observedAt") == status["teamObservedAt"]
            assert row_json == {
                "kind": "ClusterDeviceQuota", "namespace": "", "name": t.name, "applied": True,
                "hard": {"memory": 160 * gi}, "used": {"memory": 0, "devices": 0},
                "reserved": {"memory": 160 * gi, "devices": 2}, "headroom": {"memory": 0, "devices": None},
                "claims": {"allocated": 0, "pending": 2}, "exceeded": False, "current": True,
                "namespaces": [{"namespace": t.a, "used": {"memory": 0, "devices": 0},
                                "reserved": {"memory": 80 * gi, "devices": 1},
                                "claims": {"allocated": 0, "pending": 1}}],
            }
            code, out, err = await top("--kubeconfig", str(await tenant_kubeconfig(cluster, tmp_path, t.a, "viewer")),
                                       "-n", t.a)
            assert code == 0 and err == "", err
            assert [line.split()[:2] for line in out.splitlines()] == [
                ["CLUSTERDEVICEQUOTA", "NAMESPACE"], [t.name, "(total)"], [t.name, t.a]], out
            # How old the team's numbers may be, on its total.
            assert "team totals as of " in out.splitlines()[1] and f"(refreshed within {REFRESH}s" in out, out

            # The second namespace leaves the team: its copy goes, the first's totals follow.
            assert await applied(kube, t.b, t.name) is not None
            await kube.patch("v1", "namespaces", t.b, {"metadata": {"labels": {TEAM_LABEL: None}}})

            async def left() -> bool:
                copy = await applied(kube, t.a, t.name)
                return (await applied(kube, t.b, t.name) is None and copy is not None
                        and copy["status"]["reserved"]["memory"] == "80Gi")

            await poll(left, timeout=30, what="the copy of the namespace that left to be deleted")
    finally:
        await kube.delete(RBAC, "clusterroles", role["metadata"]["name"])


async def test_a_tenants_claims_write_its_own_namespaces_copy_and_the_others_once_per_period(
        kube: Kube, team: Team, make_namespace: MakeNamespace) -> None:  # noqa: F811
    t = team
    labels = {RUN_LABEL: t.run, TEAM_LABEL: t.name}
    members = [t.a, t.b, await make_namespace("team-c", labels=labels), await make_namespace("team-d", labels=labels)]
    with t.served.log_on_failure():
        for namespace in members[2:]:
            await governed(kube, namespace)

        async def copies(reserved: str) -> list[Obj] | None:
            """Every member's copy, once each shows the team's `reserved` memory."""
            found = [await applied(kube, namespace, t.name) for namespace in members]
            shown = [(c.get("status") or {}).get("reserved", {}).get("memory") if c else None for c in found]
            return [c for c in found if c] if shown == [reserved] * len(members) else None

        await poll(lambda: copies("0"), timeout=60, what="every member's copy, the two new ones included")

        async def counted() -> bool:  # the new members' creates counted, not only landed
            done = written_since(t.served, 0)
            return all((namespace, "spec") in done for namespace in members[2:])

        await poll(counted, timeout=30, what="the new members' copies counted")
        before = await writes(t.served)
        started = time.monotonic()
        # Five claim events in the first namespace, each seen in its copy before the next:
        # 80Gi, 0, 80Gi, 0, 80Gi (never the team's 160Gi: no flip at the edge).
        for step in range(5):
            name = f"mine-{step // 2}"
            if step % 2:
                await kube.delete(RESOURCE_V1, "resourceclaims", name, namespace=t.a)
            else:
                await create(kube, t, t.a, name)
            want = "0" if step % 2 else "80Gi"

            async def own(want: str = want) -> bool:
                copy = await applied(kube, t.a, t.name)
                return bool(copy and copy["status"]["namespace"]["reserved"]["memory"] == want)

            await poll(own, timeout=30, what=f"{t.a}'s copy to show its own reserved {want} (step {step})")
        converged = await poll(lambda: copies("80Gi"), timeout=60,
                               what="the other members' copies to show the team's new total after the refresh period")
        elapsed = time.monotonic() - started
        after = await writes(t.served)
        by_namespace = written_since(t.served, sum(before.values()))
        assert after - before == Counter(reason for _, reason in by_namespace), (after, before, by_namespace)
        # The claims' namespace's copy is written for its own part, once per event at most;
        # the others only by the background refresh, each at most once per period: never
        # once per claim event (5 each, were the totals written with every event).
        mine = [reason for ns, reason in by_namespace if ns == t.a]
        assert set(mine) == {"own"} and 5 <= len(mine) <= 10, by_namespace
        for namespace in members[1:]:
            theirs = [reason for ns, reason in by_namespace if ns == namespace]
            assert set(theirs) == {"refresh"} and len(theirs) <= 1 + elapsed // REFRESH, (namespace, by_namespace)
        assert {c["status"]["teamRefreshSeconds"] for c in converged} == {REFRESH}
        assert all(c["status"]["teamObservedAt"].endswith("Z") for c in converged)
