"""Who sees and who sets what, by RBAC alone, on the real API server.

- A tenant bound to the built-in `view` or `admin` ClusterRole in a namespace (a
  RoleBinding, nothing of ours) sees the namespace's DeviceQuotas, with kubectl and with
  `dra-quota top -n`: the shipped ClusterRole dra-quota-view (deploy/helm/dra-quota/
  templates/tenant-view.yaml) aggregates into view, edit and admin; the controller
  manager's clusterrole-aggregation controller folds it in. Neither may write them.
- A cluster admin who is not in system:masters (a user bound to `cluster-admin`, as on a
  managed cluster) may set the team label and the admin-access label: both shipped
  ValidatingAdmissionPolicies ask the authorizer about `label` on teams/adminaccess
  .draquota.io. A namespace `admin` may not (RBAC), nor a namespace owner given
  `cluster-admin` by a RoleBinding in its own namespace (the policies: the check is
  cluster-scoped).

Objects come from the chart rendered with its defaults (deploy/manifests/dra-quota.yaml),
with unique names, each binding narrowed to this test's namespaces by a label.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import yaml

from devcluster.served import service_account_token

from .cluster import ControlPlane
from .harness import ADMIN_LABEL, ADMISSION, DQ, RUN_LABEL, MakeNamespace, top
from .kube import ApiError, Kube, Obj, poll
from .kubectl import Kubectl, KubectlError
from .webhook_recorder import impersonated

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [d for d in yaml.safe_load_all((ROOT / "deploy/manifests/dra-quota.yaml").read_text()) if d]
RBAC = "rbac.authorization.k8s.io/v1"
TEAM_LABEL = "team.draquota.io/name"
PLURALS = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies",
           "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
           "ClusterRole": "clusterroles"}


def shipped(kind: str, name: str) -> Obj:
    (found,) = [d for d in SHIPPED if d["kind"] == kind and d["metadata"]["name"] == name]
    return copy.deepcopy(found)


def binding(kind: str, name: str, role: str, subject: Obj) -> Obj:
    return {"kind": kind, "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [subject]}


def user(name: str) -> Obj:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}


@dataclass
class Tenancy:
    run: str
    ns: str
    params_ns: str
    cluster_admin: str  # bound to cluster-admin by a ClusterRoleBinding, in no group
    ns_admin: str  # bound to `admin` in ns
    ns_owner: str  # bound to `cluster-admin` by a RoleBinding in ns


@pytest_asyncio.fixture(loop_scope="session")
async def tenancy(kube: Kube, crd: None, make_namespace: MakeNamespace) -> AsyncIterator[Tenancy]:
    run = uuid.uuid4().hex[:8]
    ns = await make_namespace("tenant", labels={RUN_LABEL: run})
    params_ns = await make_namespace("tenantparams")
    t = Tenancy(run, ns, params_ns, f"platform-{run}", f"ns-admin-{run}", f"ns-owner-{run}")
    created: list[tuple[str, str, str]] = []

    async def make(api: str, plural: str, body: Obj) -> None:
        await kube.create(api, plural, body)
        created.append((api, plural, body["metadata"]["name"]))

    try:
        await make(RBAC, "clusterroles", {**shipped("ClusterRole", "dra-quota-view"),
                                          "metadata": {**shipped("ClusterRole", "dra-quota-view")["metadata"],
                                                       "name": f"dra-quota-view-{run}"}})
        await make(RBAC, "clusterrolebindings", binding("ClusterRoleBinding", f"platform-{run}", "cluster-admin",
                                                        user(t.cluster_admin)))
        for name, role in ((t.ns_admin, "admin"), (t.ns_owner, "cluster-admin")):
            await kube.create(RBAC, "rolebindings", binding("RoleBinding", name, role, user(name)), namespace=ns)
        for sa, role in (("viewer", "view"), ("owner", "admin")):
            await kube.create("v1", "serviceaccounts", {"kind": "ServiceAccount", "metadata": {"name": sa}},
                              namespace=ns)
            await kube.create(RBAC, "rolebindings", binding("RoleBinding", sa, role,
                                                            {"kind": "ServiceAccount", "name": sa, "namespace": ns}),
                              namespace=ns)
        # The two label policies, as shipped; the admin-access one with its (empty) allowlist.
        params = shipped("ConfigMap", "dra-quota-admin-access")
        params["metadata"].update(name=f"allow-{run}", namespace=params_ns)
        await kube.create("v1", "configmaps", params, namespace=params_ns)
        for policy in ("dra-quota-team-labels", "dra-quota-admin-access-label"):
            vap = shipped("ValidatingAdmissionPolicy", policy)
            vap["metadata"]["name"] = f"{policy}-{run}"
            await make(ADMISSION, PLURALS[vap["kind"]], vap)
            bound = shipped("ValidatingAdmissionPolicyBinding", policy)
            bound["metadata"]["name"] = vap["metadata"]["name"]
            bound["spec"]["policyName"] = vap["metadata"]["name"]
            bound["spec"]["matchResources"] = {"objectSelector": {"matchLabels": {RUN_LABEL: run}}}
            if "paramRef" in bound["spec"]:
                bound["spec"]["paramRef"].update(name=f"allow-{run}", namespace=params_ns)
            await make(ADMISSION, PLURALS[bound["kind"]], bound)
        yield t
    finally:
        for api, plural, name in reversed(created):
            await kube.delete(api, plural, name)


async def tenant_kubeconfig(cluster: ControlPlane, tmp_path: Path, ns: str, account: str) -> Path:
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for entry in config["users"]:
        entry["user"] = {"token": await service_account_token(cluster, account=account, namespace=ns)}
    path = tmp_path / f"{account}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


async def test_view_and_admin_tenants_see_their_device_quotas(cluster: ControlPlane, kube: Kube, kubectl: Kubectl,
                                                              tenancy: Tenancy, tmp_path: Path) -> None:
    ns = tenancy.ns
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                           "spec": {"hard": {"memory": "80Gi"}}}, namespace=ns)
    for account in ("viewer", "owner"):
        who = f"system:serviceaccount:{ns}:{account}"

        async def listed() -> str | None:  # the aggregation controller folds the role in
            try:
                return await kubectl("get", "dq", "-n", ns, "-o", "name", f"--as={who}")
            except KubectlError:
                return None

        out = await poll(listed, timeout=30, what=f"{account} to be allowed to list DeviceQuotas")
        assert out.split() == ["devicequota.draquota.io/gpus"], out
        # Read only, as a ResourceQuota is to namespace edit/admin.
        with pytest.raises(KubectlError, match="Forbidden|forbidden"):
            await kubectl("delete", "dq", "gpus", "-n", ns, "--dry-run=server", f"--as={who}")
        with pytest.raises(KubectlError, match="forbidden"):
            await kubectl("get", "clusterdevicequotas", f"--as={who}")

        code, out, err = await top("--kubeconfig", str(await tenant_kubeconfig(cluster, tmp_path, ns, account)),
                                   "-n", ns, "-o", "json")
        assert code == 0, err
        assert "not allowed to list DeviceQuotas" not in err, err
        assert [q["name"] for q in json.loads(out)["quotas"]] == ["gpus"], out


async def label(kube: Kube, ns: str, who: str, key: str, value: str) -> str:
    """Set label `key` on `ns` as `who`, dry run: "" when allowed, else status and message."""
    try:
        await impersonated(kube, "PATCH", f"/api/v1/namespaces/{ns}", user=who,
                           body={"metadata": {"labels": {key: value}}}, params={"dryRun": "All"})
    except ApiError as err:
        return f"{err.status}: {err.message}"
    return ""


@pytest.mark.parametrize(("key", "value", "policy"), [
    (TEAM_LABEL, "ml", "dra-quota-team-labels"),
    (ADMIN_LABEL, "true", "dra-quota-admin-access-label"),
], ids=["team", "admin-access"])
async def test_a_cluster_admin_sets_the_labels_a_namespace_admin_cannot(kube: Kube, tenancy: Tenancy, key: str,
                                                                       value: str, policy: str) -> None:
    t = tenancy
    refused_by_policy = f"ValidatingAdmissionPolicy '{policy}-{t.run}'"

    async def enforced() -> str | None:  # the policy and the bindings take a moment to load
        message = await label(kube, t.ns, t.ns_owner, key, value)
        return message if refused_by_policy in message else None

    message = await poll(enforced, timeout=60, what="the policy to refuse the namespace owner")
    # Given cluster-admin in its own namespace only: the policies ask cluster-wide.
    assert message.startswith("403: ") and f'"{t.ns_owner}" is neither' in message, message
    # A namespace admin may not write its Namespace at all.
    message = await label(kube, t.ns, t.ns_admin, key, value)
    assert message.startswith("403: ") and 'cannot patch resource "namespaces"' in message, message
    # A cluster admin in no privileged group: RBAC's `*` on `*` answers the policy's question.
    assert await label(kube, t.ns, t.cluster_admin, key, value) == ""
