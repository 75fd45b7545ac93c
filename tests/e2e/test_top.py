"""`dra-quota top` as a process against the real API server.

The status read here is written through the `status` subresource by the test itself (the
quota controller writes the same fields; its own e2e tests check what it writes): this
test proves what `top` reads and prints, the kubeconfig handling and the exit codes, and,
for ClusterDeviceQuotas (team quotas), that it reads them beside the DeviceQuotas and that
a user who may list a namespace's DeviceQuotas but no ClusterDeviceQuota (real RBAC) still
gets the namespace's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.served import service_account_token

from .cluster import ControlPlane, free_ports
from .harness import DQ, MakeNamespace, Served, running, top, unique
from .kube import Kube

pytestmark = pytest.mark.e2e

GiB = 1024**3


async def test_top_prints_published_usage(cluster: ControlPlane, kube: Kube, crd: None,
                                          make_namespace: MakeNamespace) -> None:
    counted, fresh = await make_namespace("top"), await make_namespace("top")
    quota = await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                                   "spec": {"hard": {"memory": "320Gi", "devices": 4}}},
                              namespace=counted)
    quota["status"] = {"observedGeneration": quota["metadata"]["generation"],
                       "used": {"memory": 160 * GiB, "devices": 2}, "reserved": {"memory": 80 * GiB, "devices": 1},
                       "claims": {"allocated": 2, "pending": 1},
                       "conditions": [{"type": "Exceeded", "status": "False", "reason": "WithinLimits",
                                       "message": "", "lastTransitionTime": "2026-11-23T00:00:00Z"}]}
    await kube.replace(DQ, "devicequotas", quota, namespace=counted, subresource="status")
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "new"},
                                           "spec": {"hard": {"memory": "80Gi"}}}, namespace=fresh)
    kubeconfig = str(cluster.kubeconfig)

    code, out, err = await top("--kubeconfig", kubeconfig, "-o", "json")
    assert (code, err) == (0, ""), err  # listing the ClusterDeviceQuotas too: no warning
    rows = {(q["namespace"], q["name"]): q for q in json.loads(out)["quotas"]}
    assert rows[(counted, "gpus")] == {
        "kind": "DeviceQuota", "namespace": counted, "name": "gpus", "hard": {"memory": 320 * GiB, "devices": 4},
        "used": {"memory": 160 * GiB, "devices": 2}, "reserved": {"memory": 80 * GiB, "devices": 1},
        "claims": {"allocated": 2, "pending": 1}, "exceeded": False, "current": True,
    }
    assert rows[(fresh, "new")]["used"] == {"memory": None, "devices": None}
    assert not rows[(fresh, "new")]["current"]

    code, out, err = await top("--kubeconfig", kubeconfig, "-n", counted)
    assert code == 0, err
    header, line, *rest = out.splitlines()
    assert header.split()[:2] == ["NAMESPACE", "QUOTA"] and not rest
    assert line.split() == [counted, "gpus", "160Gi", "/", "80Gi", "/", "320Gi", "2", "/", "1", "/", "4",
                            "2", "/", "1"]
    code, out, _ = await top("--kubeconfig", kubeconfig, "-n", fresh)
    assert "not counted yet" in out and "- / - / 80Gi" in out


async def test_top_says_why_it_cannot_read(tmp_path: Path, cluster: ControlPlane) -> None:
    closed = tmp_path / "closed.kubeconfig"
    port = free_ports(1)[0]  # nothing listens there
    closed.write_text(cluster.kubeconfig.read_text().replace(cluster.server, f"https://127.0.0.1:{port}"))
    code, out, err = await top("--kubeconfig", str(closed))
    assert (code, out) == (1, "") and "cannot read DeviceQuotas from the API server" in err, err
    missing = tmp_path / "missing.kubeconfig"
    code, _, err = await top("--kubeconfig", str(missing))
    assert code == 1 and "kubeconfig" in err and "Traceback" not in err, err


async def test_every_command_finds_the_cluster_through_kubeconfig(tmp_path: Path, cluster: ControlPlane, kube: Kube,
                                                                  crd: None, make_namespace: MakeNamespace) -> None:
    """`KUBECONFIG=... dra-quota serve` reaches the cluster as `top` does (never "cannot
    reach the cluster: Service host/port is not set"): both resolve credentials one way, a
    list merged as kubectl merges it (missing entries skipped, the first current-context
    wins)."""
    ns = await make_namespace("creds")
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                           "spec": {"hard": {"memory": "80Gi"}}}, namespace=ns)
    # A first file naming the context, the cluster's own file defining it, a missing one between.
    chooser = tmp_path / "chooser.kubeconfig"
    chooser.write_text("apiVersion: v1\nkind: Config\ncurrent-context: minik8s\n")
    listed = os.pathsep.join([str(chooser), str(tmp_path / "missing"), str(cluster.kubeconfig)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE_")} | {"KUBECONFIG": listed}
    code, out, err = await top("-n", ns, "-o", "json", env=env)
    assert code == 0, err
    assert [q["name"] for q in json.loads(out)["quotas"]] == ["gpus"]

    served = Served(cluster, free_ports(1)[0], tmp_path / "serve.log", kubeconfig_from_env=True)
    async for handle in running(served):
        assert f"credentials: kubeconfig {cluster.kubeconfig} ($KUBECONFIG" in handle.log_text()


def amounts(memory: int, devices: int) -> dict[str, int]:
    return {"memory": memory * GiB, "devices": devices}


async def test_top_shows_each_team_with_its_namespaces(cluster: ControlPlane, kube: Kube, crd: None,
                                                       make_namespace: MakeNamespace) -> None:
    dev, train, other = [await make_namespace("top-team") for _ in range(3)]
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                           "spec": {"hard": {"memory": "160Gi"}}}, namespace=dev)
    name = unique("top-team")
    team = await kube.create(DQ, "clusterdevicequotas", {
        "kind": "ClusterDeviceQuota", "metadata": {"name": name},
        "spec": {"hard": {"memory": "640Gi", "devices": 8}, "namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [dev, train]}]}}})
    try:
        parts = [{"namespace": dev, "used": amounts(80, 1), "reserved": amounts(0, 0),
                  "claims": {"allocated": 1, "pending": 0}},
                 {"namespace": train, "used": amounts(400, 5), "reserved": amounts(160, 2),
                  "claims": {"allocated": 5, "pending": 2}}]
        team["status"] = {"observedGeneration": team["metadata"]["generation"], "used": amounts(480, 6),
                          "reserved": amounts(160, 2), "claims": {"allocated": 6, "pending": 2}, "namespaces": parts}
        await kube.replace(DQ, "clusterdevicequotas", team, subresource="status")
        await teams_shown(cluster, name, parts, dev, train, other)
    finally:
        await kube.delete(DQ, "clusterdevicequotas", name)


async def teams_shown(cluster: ControlPlane, name: str, parts: list[dict[str, Any]], dev: str, train: str,
                      other: str) -> None:
    kubeconfig = str(cluster.kubeconfig)
    code, out, err = await top("--kubeconfig", kubeconfig, "-o", "json")
    assert (code, err) == (0, ""), err
    rows = {(q["namespace"], q["name"]): q for q in json.loads(out)["quotas"]}
    assert rows[("", name)] == {
        "kind": "ClusterDeviceQuota", "namespace": "", "name": name, "hard": amounts(640, 8),
        "used": amounts(480, 6), "reserved": amounts(160, 2), "claims": {"allocated": 6, "pending": 2},
        "exceeded": False, "current": True, "namespaces": parts,
    }
    assert rows[(dev, "gpus")]["kind"] == "DeviceQuota"

    # -n: the namespace's DeviceQuotas, then the team with the namespace's part only.
    code, out, err = await top("--kubeconfig", kubeconfig, "-n", train)
    assert (code, err) == (0, ""), err
    header, total, part, *rest = out.splitlines()
    assert header.split()[:2] == ["CLUSTERDEVICEQUOTA", "NAMESPACE"] and not rest, out
    assert total.split() == [name, "(total)", "480Gi", "/", "160Gi", "/", "640Gi", "6", "/", "2", "/", "8",
                             "6", "/", "2"]
    assert part.split() == [name, train, "400Gi", "/", "160Gi", "5", "/", "2", "5", "/", "2"]
    code, out, err = await top("--kubeconfig", kubeconfig, "-n", dev)
    assert [line.split()[:2] for line in out.splitlines()] == [
        ["NAMESPACE", "QUOTA"], [dev, "gpus"], [], ["CLUSTERDEVICEQUOTA", "NAMESPACE"], [name, "(total)"],
        [name, dev]], out
    code, out, err = await top("--kubeconfig", kubeconfig, "-n", other)
    assert (code, out) == (0, "") and "No DeviceQuotas or ClusterDeviceQuotas found" in err, err


async def test_a_user_who_may_not_list_teams_still_sees_its_namespace(tmp_path: Path, cluster: ControlPlane,
                                                                      kube: Kube, crd: None,
                                                                      make_namespace: MakeNamespace) -> None:
    """A tenant's account: `list` on its namespace's DeviceQuotas (a Role), nothing on the
    cluster-scoped ClusterDeviceQuotas (403 from the real authorizer)."""
    ns = await make_namespace("top-tenant")
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                           "spec": {"hard": {"memory": "80Gi"}}}, namespace=ns)
    rbac = "rbac.authorization.k8s.io/v1"
    await kube.create(rbac, "roles", {"kind": "Role", "metadata": {"name": "quota-reader"}, "rules": [
        {"apiGroups": ["draquota.io"], "resources": ["devicequotas"], "verbs": ["list"]}]}, namespace=ns)
    await kube.create(rbac, "rolebindings", {
        "kind": "RoleBinding", "metadata": {"name": "quota-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "quota-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": ns}]}, namespace=ns)
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": await service_account_token(cluster, account="tenant", namespace=ns)}
    tenant = tmp_path / "tenant.kubeconfig"
    tenant.write_text(yaml.safe_dump(config))

    code, out, err = await top("--kubeconfig", str(tenant), "-n", ns)
    assert code == 0, err
    assert [line.split()[:2] for line in out.splitlines()] == [["NAMESPACE", "QUOTA"], [ns, "gpus"]], out
    assert err.startswith("warning: not allowed to list ClusterDeviceQuotas, team quotas not shown"), err
