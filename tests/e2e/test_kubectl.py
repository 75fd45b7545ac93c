"""What installing the DeviceQuota CRD does to kubectl's names, with the real kubectl 1.37 (issue 17).

kubectl expands a category before it looks at short names, so a CRD declaring
`categories: [quota]` made `kubectl get quota` list DeviceQuotas *instead of*
ResourceQuotas (runbooks silently lost their ResourceQuotas). With the CRD of
deploy/crds installed, on the real API server and its own kubectl (tests/e2e/kubectl.py):
`quota` still means ResourceQuotas, our category `dra-quota` lists DeviceQuotas, and none
of the CRD's names, short names or categories is a name, short name or category of any
other resource the API server serves.
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
