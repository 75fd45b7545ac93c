"""A tenant sees its team's budget in its own namespace, and nothing of the other members:
AppliedClusterDeviceQuotas on the real API server, written by one `dra-quota serve`.

A team of two namespaces under one ClusterDeviceQuota (test_cluster_quota_smoke.py's
fixture), one claim in each. A ServiceAccount bound to the built-in `view` in the first
namespace (the shipped dra-quota-view ClusterRole aggregated into it) reads, with kubectl
and with `dra-quota top -n`, the team's hard, totals and headroom and its own namespace's
part; it may not read the other namespace's copy nor the ClusterDeviceQuota, and its copy
names no other member. The second namespace relabelled out of the team loses its copy, and
the first's totals follow.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from .cluster import ControlPlane
from .harness import DQ, top
from .kube import Kube, Obj, poll
from .kubectl import Kubectl, KubectlError
from .test_cluster_quota_smoke import TEAM_LABEL, Team, create, team  # noqa: F401 (the fixture)
from .test_tenant_rbac import RBAC, binding, shipped, tenant_kubeconfig

pytestmark = pytest.mark.e2e

ACDQ = "appliedclusterdevicequotas"


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
                reserved = [(i.get("status") or {}).get("reserved", {}).get("memory") for i in items]
                return items[0] if reserved == ["160Gi"] else None

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
