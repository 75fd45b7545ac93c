"""What installing the DeviceQuota CRD does to kubectl's names, columns and explain, with the real kubectl 1.37.

kubectl expands a category before it looks at short names, so a CRD declaring
`categories: [quota]` made `kubectl get quota` list DeviceQuotas *instead of*
ResourceQuotas (runbooks silently lost their ResourceQuotas). With the CRD of
deploy/crds installed, on the real API server and its own kubectl (tests/e2e/kubectl.py):
`quota` still means ResourceQuotas, our category `dra-quota` lists DeviceQuotas, and none
of the CRD's names, short names or categories is a name, short name or category of any
other resource the API server serves. `kubectl get dq -A` fits 120 columns (the rest under
`-o wide`) and `kubectl explain` describes every field it is asked about.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import pytest

from .harness import CRD, CRDS, DQ
from .kube import Kube
from .kubectl import Kubectl

pytestmark = pytest.mark.e2e

NAMES = CRD["spec"]["names"]


async def test_quota_still_lists_resourcequotas_and_our_category_lists_devicequotas(
        kube: Kube, crd: None, kubectl: Kubectl, make_namespace: Callable[..., Awaitable[str]]) -> None:
    ns = await make_namespace()
    await kube.create("v1", "resourcequotas", {"kind": "ResourceQuota", "metadata": {"name": "pods"},
                                               "spec": {"hard": {"pods": "10"}}}, namespace=ns)
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                           "spec": {"hard": {"memory": "80Gi"}}}, namespace=ns)

    assert (await kubectl("get", "quota", "-n", ns, "-o", "name")).split() == ["resourcequota/pods"]
    (category,) = NAMES["categories"]
    assert (await kubectl("get", category, "-n", ns, "-o", "name")).split() == ["devicequota.draquota.io/gpus"]
    assert (await kubectl("get", "dq", "-n", ns, "-o", "name")).split() == ["devicequota.draquota.io/gpus"]


async def test_our_names_shadow_no_other_resource(crd: None, kubectl: Kubectl) -> None:
    listed = json.loads(await kubectl("api-resources", "-o", "json"))["resources"]
    assert any(r["name"] == NAMES["plural"] and r.get("group") == CRD["spec"]["group"] for r in listed)
    others: set[str] = set()
    for r in listed:
        if r.get("group", "") != CRD["spec"]["group"]:  # the core group has none
            others |= {r["name"], r.get("singularName", ""), *r.get("shortNames", []), *r.get("categories", [])}
    assert {"quota", "resourcequotas", "all", "pods"} <= others, "kubectl's names were not read"
    # The ClusterDeviceQuota CRD's names too (`cdq`, `clusterdevicequotas`; same category).
    ours = {name for crd in CRDS for names in [crd["spec"]["names"]]
            for name in (names["plural"], names["singular"], *names["shortNames"], *names["categories"])}
    assert "cdq" in ours and not ours & others, ours & others


GiB = 1024**3


async def test_kubectl_get_fits_120_columns_and_wide_shows_the_rest(
        kube: Kube, crd: None, kubectl: Kubectl, make_namespace: Callable[..., Awaitable[str]]) -> None:
    ns = await make_namespace("ml-training")  # ml-training-<8 hex>: 20 characters
    name = "h100-quota"  # with the namespace, 30 characters: the room the default columns leave
    quota = await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": name},
                                                   "spec": {"hard": {"memory": "1200Gi", "devices": 16}}},
                              namespace=ns)
    quota["status"] = {"used": {"memory": "1128Gi", "devices": 8}, "reserved": {"memory": "282Gi", "devices": 2},
                       "claims": {"allocated": 4, "pending": 2},
                       "conditions": [{"type": "Exceeded", "status": "True", "reason": "AboveHard", "message": "",
                                       "lastTransitionTime": "2026-11-23T00:00:00Z"}]}
    await kube.replace(DQ, "devicequotas", quota, namespace=ns, subresource="status")
    only = f"--field-selector=metadata.namespace={ns}"
    lines = (await kubectl("get", "dq", "-A", only)).splitlines()
    assert max(len(line) for line in lines) <= 120, lines
    assert lines[0].split() == ["NAMESPACE", "NAME", "HARD", "MEMORY", "USED", "MEMORY", "RESERVED", "MEMORY",
                                "HARD", "DEVICES", "USED", "DEVICES", "EXCEEDED"]
    assert lines[1].split() == [ns, name, "1200Gi", "1128Gi", "282Gi", "16", "8", "True"]
    wide = (await kubectl("get", "dq", "-A", only, "-o", "wide")).splitlines()
    assert wide[0].split()[13:] == ["RESERVED", "DEVICES", "PENDING", "CLAIMS", "ENFORCEMENT", "AGE", "WINDOW",
                                    "IN", "FORCE", "MEMORY", "IN", "FORCE", "DEVICES", "NEXT", "CHANGE"]
    assert wide[1].split()[8:11] == ["2", "2", "Enforce"]
    assert len(wide[1].split()) == 12, wide  # no windows: the last four cells empty


@pytest.mark.parametrize("field", ["devicequota.spec", "devicequota.status", "devicequota.status.conditions",
                                   "devicequota.spec.devices.selectors.cel.expression",
                                   "clusterdevicequota.spec.namespaceSelector.matchExpressions",
                                   "clusterdevicequota.status.namespaces.claims"])
async def test_kubectl_explain_describes_every_field(crd: None, kubectl: Kubectl, field: str) -> None:
    explained = await kubectl("explain", field, "--recursive=false")
    assert "<no description>" not in explained and "DESCRIPTION:" in explained, explained
