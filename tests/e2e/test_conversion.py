"""quota.objects.conversion against the real API server's resource.k8s.io v1beta1/v1beta2 conversion.

A default 1.37 kube-apiserver serves only resource.k8s.io/v1, so this module runs a
control plane of its own with `--runtime-config` serving both betas. Every DeviceClass,
ResourceSlice, ResourceClaim (with its allocation, written through /status) and
ResourceClaimTemplate of examples/, written back as v1beta1 and as v1beta2
(tests/unit/betas.py), is created in that version and read back as v1; what our parsers
read from `quota.objects.conversion.as_v1(beta)` must equal what they read from the API
server's v1 object. Objects the API server refuses (strict field validation, or
validation of the converted object) must be refused by us too.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube.apierror import ApiError
from quota.objects.claims import parse_claim, parse_device_class
from quota.objects.claimspec import ClaimError
from quota.objects.conversion import as_v1
from quota.objects.slices import SliceError, parse_slice
from tests.unit.betas import downgrade

from .cluster import ControlPlane, private_cluster
from .kube import Kube, resource_path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PLURALS = {"DeviceClass": "deviceclasses", "ResourceSlice": "resourceslices", "ResourceClaim": "resourceclaims",
           "ResourceClaimTemplate": "resourceclaimtemplates"}
RUNTIME_CONFIG = "--runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"


@pytest.fixture(scope="module")
def beta_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with private_cluster(tmp_path_factory.mktemp("minik8s-betas"), {"apiserver": (RUNTIME_CONFIG,)}) as cp:
        yield cp


def example_docs() -> list[dict[str, Any]]:
    return [d for f in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def read(obj: dict[str, Any]) -> Any:
    """What pricing sees of a v1 object: the parsed value, identity fields aside."""
    kind = obj["kind"]
    if kind == "ResourceSlice":
        parsed = parse_slice(obj)
        # Devices compare by identity (quota.values.model.Device): compare their fields.
        devices = [tuple(getattr(d, f.name) for f in fields(d)) for d in parsed.devices]
        return replace(parsed, devices=()), devices
    if kind == "DeviceClass":
        return parse_device_class(obj)
    claim = parse_claim(obj)
    return claim.kind, claim.namespace, claim.name, claim.spec, claim.allocation


async def create_beta(kube: Kube, beta: dict[str, Any]) -> dict[str, Any]:
    """Create `beta` in its own version (allocation through /status) and read it back as v1."""
    kind, meta = beta["kind"], beta["metadata"]
    version, plural, ns = beta["apiVersion"], PLURALS[beta["kind"]], meta.get("namespace")
    body = {k: v for k, v in beta.items() if k != "status"}
    created = await kube.request("POST", resource_path(version, plural, namespace=ns), body=body,
                                 params={"fieldValidation": "Strict"})
    if kind == "ResourceClaim" and beta.get("status"):
        await kube.request("PUT", resource_path(version, plural, meta["name"], ns, "status"),
                           body={**created, "status": beta["status"]})
    return await kube.get("resource.k8s.io/v1", plural, meta["name"], namespace=ns)


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
async def test_examples_convert_as_the_api_server_converts_them(beta_cluster: ControlPlane, version: str) -> None:
    docs = example_docs()
    async with beta_cluster.client() as kube:
        # Every namespace may hold adminAccess claims here: team-a's debug-h100 (which
        # the API server refuses there) is converted like any other claim.
        for ns in {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}:
            if await kube.get_or_none("v1", "namespaces", ns) is None:
                await kube.create("v1", "namespaces", {"kind": "Namespace", "metadata": {
                    "name": ns, "labels": {"resource.kubernetes.io/admin-access": "true"}}})
        compared = 0
        for doc in docs:
            if doc["kind"] not in PLURALS:
                continue
            beta = downgrade(copy.deepcopy(doc), version)
            beta["metadata"]["name"] += f"-{version}"  # one cluster for both versions
            server_v1 = await create_beta(kube, beta)
            # Only the spec's conversion is compared: the server stamps the creation time.
            beta["metadata"]["creationTimestamp"] = server_v1["metadata"].get("creationTimestamp")
            assert read(as_v1(beta, beta["kind"], ClaimError)) == read(server_v1), beta["metadata"]["name"]
            compared += 1
    assert compared == 4 + 6 + 24  # classes, slices, claims and templates of examples/


B1 = "resource.k8s.io/v1beta1"


def claim_b1(name: str, *requests: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": B1, "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": list(requests)}}}


SUBS = [{"name": "a", "deviceClassName": "gpu.nvidia.com", "count": 2}, {"name": "b", "deviceClassName": "gpu.nvidia.com"}]

# (id, v1beta1 object) both the API server and we accept: the same reading.
ACCEPTED = [
    ("class only", claim_b1("class-only", {"name": "r", "deviceClassName": "gpu.nvidia.com"})),
    ("All", claim_b1("all", {"name": "r", "deviceClassName": "gpu.nvidia.com", "allocationMode": "All"})),
    ("firstAvailable with zero values inline", claim_b1("zeroes", {"name": "r", "firstAvailable": SUBS,
                                                                   "deviceClassName": "", "count": 0})),
    ("slice with empty nodeName, allNodes and empty basic maps",
     {"apiVersion": B1, "kind": "ResourceSlice", "metadata": {"name": "empties"},
      "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
               "nodeName": "", "allNodes": True,
               "devices": [{"name": "g", "basic": {"attributes": {}, "capacity": {"memory": {"value": "8Gi"}},
                                                   "consumesCounters": [], "taints": []}}, {"name": "h"}]}}),
]
# (id, v1beta1 object, what the API server's message contains): refused by both.
REFUSED = [
    ("v1 exactly under v1beta1", claim_b1("exactly", {"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}),
     'unknown field "spec.devices.requests[0].exactly"'),
    ("adminAccess false beside firstAvailable", claim_b1("both", {"name": "r", "firstAvailable": SUBS,
                                                                   "adminAccess": False}),
     "exactly one of"),
    ("count without a class", claim_b1("noclass", {"name": "r", "count": 2}), "deviceClassName"),
    ("v1 device fields under v1beta1",
     {"apiVersion": B1, "kind": "ResourceSlice", "metadata": {"name": "flat"},
      "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
               "nodeName": "n", "devices": [{"name": "g", "capacity": {"memory": {"value": "8Gi"}}}]}},
     'unknown field "spec.devices[0].capacity"'),
]


@pytest.mark.parametrize("beta", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
async def test_edge_cases_the_api_server_accepts_read_alike(beta_cluster: ControlPlane, beta: dict[str, Any]) -> None:
    async with beta_cluster.client() as kube:
        server_v1 = await create_beta(kube, beta)
    assert read(as_v1(beta, beta["kind"], ClaimError)) == read(server_v1)


@pytest.mark.parametrize(("beta", "message"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
async def test_edge_cases_the_api_server_refuses_are_refused(
        beta_cluster: ControlPlane, beta: dict[str, Any], message: str) -> None:
    async with beta_cluster.client() as kube:
        with pytest.raises(ApiError) as refused:
            await create_beta(kube, beta)
    assert message in str(refused.value)
    with pytest.raises((ClaimError, SliceError)):
        read(as_v1(beta, beta["kind"], SliceError if beta["kind"] == "ResourceSlice" else ClaimError))
