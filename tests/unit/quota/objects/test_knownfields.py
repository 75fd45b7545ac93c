"""quota.objects.knownfields: the fields `check` accepts are the API's, and unknown ones read as the API server says.

The trees are compared with the Go types the e2e control plane is built from
(tests/tools/gotypes.py reads k8s.io/api and apimachinery at tests/cluster/go.mod's
versions) and with the DeviceQuota CRD, so a field added upstream or to the CRD fails
here until `check` knows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from quota.objects.knownfields import MAX_REPORTED, SCHEMAS, Schema, strict_error, unknown_fields

from ....tools.gotypes import difference, tree
from ...builders import exactly, make_claim, make_device, make_slice, request

CRD = Path(__file__).resolve().parents[4] / "deploy" / "crds" / "devicequota.yaml"
KINDS = ("DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate")
# v1beta1 places that hold v1 fields: left to quota.objects.conversion, which names the version.
V1_PLACES_IN_V1BETA1 = {".spec.spec.devices.requests[].exactly", ".spec.devices.requests[].exactly"} | {
    f".spec.devices[].{field}" for field in (
        "attributes", "capacity", "consumesCounters", "nodeName", "nodeSelector", "allNodes", "taints",
        "bindsToNode", "bindingConditions", "bindingFailureConditions", "allowMultipleAllocations",
        "nodeAllocatableResources")}


@pytest.mark.parametrize("version", ["v1", "v1beta1", "v1beta2"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_trees_are_the_go_types(version: str, kind: str) -> None:
    ours = SCHEMAS[f"resource.k8s.io/{version}"][kind]
    only_ours, only_theirs = difference(ours, tree(f"k8s.io/api/resource/{version}", kind))
    assert only_theirs == set(), f"fields of the Go type check would refuse: {sorted(only_theirs)}"
    allowed = {p for p in V1_PLACES_IN_V1BETA1 if p.startswith(".spec.devices[]")} if kind == "ResourceSlice" else \
        {p for p in V1_PLACES_IN_V1BETA1 if "requests" in p and p.startswith(".spec.spec") == (
            kind == "ResourceClaimTemplate")}
    assert only_ours == (allowed if version == "v1beta1" and kind != "DeviceClass" else set())


def crd_tree(schema: dict[str, Any]) -> Schema:
    if schema.get("type") == "array":
        return [crd_tree(schema["items"])]
    if "properties" in schema:
        return {name: crd_tree(sub) for name, sub in schema["properties"].items()}
    return None


def test_the_device_quota_spec_is_the_crds() -> None:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    crd_spec = crd_tree(version["schema"]["openAPIV3Schema"]["properties"]["spec"])
    ours = SCHEMAS[f"{crd['spec']['group']}/{version['name']}"][crd["spec"]["names"]["kind"]]
    assert difference(ours["spec"], crd_spec) == (set(), set())


def claim_with(body: dict[str, Any]) -> dict[str, Any]:
    """A claim of one request "gpu" whose body (`exactly` or `firstAvailable`) is `body`."""
    return make_claim("c", {"name": "gpu", **body})


@pytest.mark.parametrize(("obj", "paths"), [
    (claim_with({"exactly": {"deviceClassname": "gpu"}}), ["spec.devices.requests[0].exactly.deviceClassname"]),
    (claim_with({"exactly": {**exactly("gpu"), "selector": [{"cel": {"expression": "true"}}]}}),
     ["spec.devices.requests[0].exactly.selector"]),
    (claim_with({"firstAvailable": [{"name": "a", "deviceClassName": "gpu", "adminAccess": True}]}),
     ["spec.devices.requests[0].firstAvailable[0].adminAccess"]),  # subrequests have no adminAccess
    ({**make_claim("c", request("gpu", exactly("gpu"))), "metadata": {"name": "c", "lables": {}}},
     ["metadata.lables"]),
    (make_slice("s", [{**make_device("d0"), "capacity": {"memory": {"vaule": "80Gi"}}}]),
     ["spec.devices[0].capacity.memory.vaule"]),
    ({"apiVersion": "draquota.io/v1alpha1", "kind": "DeviceQuota", "metadata": {"name": "q"},
      "spec": {"hard": {"memory": "1Gi", "gpus": 1}, "enforcment": "Audit"}, "status": {"anything": 1}},
     ["spec.hard.gpus", "spec.enforcment"]),
    ({"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim", "metadata": {"name": "c"},
      "spec": {"devices": {"requests": [{"name": "r", "deviceClassName": "gpu", "count": 1, "cnt": 2}]}}},
     ["spec.devices.requests[0].cnt"]),
])
def test_unknown_fields_are_named_by_their_path(obj: dict[str, Any], paths: list[str]) -> None:
    assert unknown_fields(obj) == (paths, len(paths))
    assert strict_error(obj) == "strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in paths)


def test_what_kubectl_prints_is_known() -> None:
    """Maps with free keys, managedFields, a claim's status as the scheduler writes it."""
    claim = claim_with({"exactly": exactly("gpu")})
    claim["metadata"].update(labels={"any/key": "v"}, annotations={"a": "b"}, managedFields=[
        {"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"x": {}}}}])
    claim["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "d", "pool": "p", "device": "x", "consumedCapacity": {"memory": "1Gi"}}],
        "config": [{"source": "FromClass", "opaque": {"driver": "d", "parameters": {"free": ["form"]}}}]}},
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}
    assert strict_error(claim) is None
    # Kinds and versions without a tree are the parsers' to judge.
    assert strict_error({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n", "x": 1}}) is None


def test_many_unknown_fields_are_counted_not_all_listed() -> None:
    claim = claim_with({"exactly": {**exactly("gpu"), **{f"typo{i}": i for i in range(MAX_REPORTED + 5)}}})
    found, total = unknown_fields(claim)
    assert (len(found), total) == (MAX_REPORTED, MAX_REPORTED + 5)
    assert (strict_error(claim) or "").endswith(", and 5 more")
