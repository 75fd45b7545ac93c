"""The chart's shipped manifest (deploy/manifests/dra-quota.yaml) on the e2e cluster.

Its objects applied with server-side apply, as `kubectl apply --server-side` would, and
its ServiceAccount as a kubeconfig holding a TokenRequest token, so that `serve` runs with
exactly the chart's RBAC. Used by test_chart.py (the manifest itself), test_kueue.py (the
Kueue rights) and bench/admission.py (serve as a Deployment would run it); the rendering
is tests/tools/chart.py's.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import yaml

from kube.api import Resource

from ..tools.chart import MANIFEST, NAMESPACE, documents, find
from .cluster import ControlPlane
from .harness import PLURALS
from .kube import ApiError, Kube, Obj

MANAGER = "e2e-chart"
OBJECTS = documents(MANIFEST.read_text())
DEPLOYMENT = find(OBJECTS, "Deployment")
ACCOUNT = find(OBJECTS, "ServiceAccount")["metadata"]["name"]
SECRET = next(a.partition("=")[2] for a in DEPLOYMENT["spec"]["template"]["spec"]["containers"][0]["args"]
              if a.startswith("--cert-secret="))
# REST names of the kinds in the manifest (the API server's discovery, written down).
PLURAL = {"CustomResourceDefinition": "customresourcedefinitions", "ServiceAccount": "serviceaccounts",
          "ConfigMap": "configmaps", "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
          "Role": "roles", "RoleBinding": "rolebindings", "Service": "services", "Deployment": "deployments",
          "PodDisruptionBudget": "poddisruptionbudgets",
          "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
          "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
          "ServiceMonitor": "servicemonitors", "PrometheusRule": "prometheusrules",
          "NetworkPolicy": "networkpolicies", **PLURALS}


def resource(obj: Obj) -> Resource:
    return Resource(obj["apiVersion"], PLURAL[obj["kind"]])


async def apply(kube: Kube, obj: Obj, *, dry_run: bool = False) -> Obj:
    """Server-side apply, as `kubectl apply --server-side` does (conflicts are errors, not
    forced; an unknown or duplicate field is an error, not a warning or silently pruned)."""
    meta = obj["metadata"]
    path = resource(obj).path(meta.get("namespace"), meta["name"])
    params = {"fieldManager": MANAGER, "fieldValidation": "Strict", **({"dryRun": "All"} if dry_run else {})}
    return await kube.api.request("PATCH", path, params=params, body=obj, content_type="application/apply-patch+yaml")


async def ensure_namespace(kube: Kube, name: str) -> None:
    with contextlib.suppress(ApiError):  # 409: another test made it; it is never deleted
        await kube.create("v1", "namespaces", {"kind": "Namespace", "metadata": {"name": name}})


def token_kubeconfig(cluster: ControlPlane, token: str, path: Path) -> Path:
    """A kubeconfig that authenticates with `token` alone (no client certificate)."""
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "chart",
        "clusters": [{"name": "e2e", "cluster": {"server": cluster.server,
                                                 "certificate-authority": str(cluster.ca_file)}}],
        "users": [{"name": ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "chart", "context": {"cluster": "e2e", "user": ACCOUNT}}],
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
# The Lease the chart's Role lets its ServiceAccount update (by name).
LEASE = next(a.partition("=")[2] for o in OBJECTS if o["kind"] == "Deployment"
             for a in o["spec"]["template"]["spec"]["containers"][0]["args"]
             if a.startswith("--leader-election-lease-name="))


async def chart_kubeconfig(cluster: ControlPlane, kube: Kube, path: Path) -> Path:
    """A kubeconfig of the chart's ServiceAccount with exactly the chart's RBAC (the shipped
    manifest's, default values: `serve.kueue: auto`): test_kueue.py proves the Kueue rights
    with it, bench/admission.py runs serve as a Deployment would."""
    await ensure_namespace(kube, NAMESPACE)
    for obj in OBJECTS:
        if obj["kind"] in RBAC_KINDS:
            await apply(kube, obj)
    answer = await kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token",
                                body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                      "spec": {"expirationSeconds": 3600}})
    return token_kubeconfig(cluster, answer["status"]["token"], path)
