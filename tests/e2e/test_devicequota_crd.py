"""deploy/crds/devicequota.yaml against a real kube-apiserver.

The CRD is the contract platform teams install first: the API server must accept it,
serve `dq`, apply its validation to what users write (the same inputs
quota.quotas.devicequota accepts or refuses), default `enforcement`, and keep `status` behind
its subresource.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from quota.quotas.devicequota import QuotaError, parse_device_quota
from quota.values.model import Limits

from .kube import ApiError, Kube

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "deploy/crds/devicequota.yaml").read_text())
GV = "draquota.io/v1alpha1"


@pytest_asyncio.fixture(loop_scope="session")
async def crd(kube: Kube) -> dict[str, Any]:
    try:
        await kube.create("apiextensions.k8s.io/v1", "customresourcedefinitions", CRD)
    except ApiError as err:
        if err.status != 409:
            raise
    established: dict[str, Any] = await kube.wait_for_condition(
        "apiextensions.k8s.io/v1", "customresourcedefinitions", CRD["metadata"]["name"], "Established", timeout=60
    )
    return established


def quota(name: str, **spec: Any) -> dict[str, Any]:
    return {"kind": "DeviceQuota", "metadata": {"name": name}, "spec": spec}


async def test_served_with_short_name_and_printer_columns(kube: Kube, crd: dict[str, Any]) -> None:
    discovery = await kube.request("GET", f"/apis/{GV}")
    (resource,) = [r for r in discovery["resources"] if r["name"] == "devicequotas"]
    assert resource["shortNames"] == ["dq"] and resource["namespaced"] is True
    assert any(r["name"] == "devicequotas/status" for r in discovery["resources"])
    columns = [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:6] == ["Hard Memory", "Used Memory", "Reserved Memory", "Hard Devices", "Used Devices", "Exceeded"]


TABLE = "application/json;as=Table;g=meta.k8s.io;v=v1"  # what kubectl get asks for


async def test_kubectl_get_shows_an_exceeded_quota_and_its_pending_claims(
    kube: Kube, crd: dict[str, Any], make_namespace: Callable[..., Awaitable[str]]
) -> None:
    """The columns as the API server renders them for kubectl (its Table): 282Gi used against
    a hard lowered to 200Gi must not look normal."""
    ns = await make_namespace("dq-table")
    lowered = await kube.create(GV, "devicequotas", quota("gpus", hard={"memory": "200Gi", "devices": 8}),
                                namespace=ns)
    lowered["status"] = {
        "used": {"memory": "282Gi", "devices": 2}, "reserved": {"memory": "0", "devices": 0},
        "claims": {"allocated": 2, "pending": 3},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Counted", "message": "",
                        "lastTransitionTime": "2026-11-23T00:00:00Z"},
                       {"type": "Exceeded", "status": "True", "reason": "AboveHard", "message": "",
                        "lastTransitionTime": "2026-11-23T00:00:00Z"}]}
    await kube.replace(GV, "devicequotas", lowered, namespace=ns, subresource="status")
    await kube.create(GV, "devicequotas", quota("fresh", hard={"memory": "80Gi"}), namespace=ns)
    # A quota with windows, as the controller writes its status while one is open.
    windowed = quota("burst", hard={"memory": "320Gi"})
    windowed["spec"]["windows"] = [{"name": "deadline", "hard": {"memory": "640Gi"},
                                    "start": "2026-12-21T07:00:00Z", "end": "2026-12-25T17:00:00Z"}]
    windowed = await kube.create(GV, "devicequotas", windowed, namespace=ns)
    windowed["status"] = {"effectiveHard": {"memory": "640Gi"}, "activeWindow": "deadline",
                          "nextChange": "2026-12-25T17:00:00Z"}
    await kube.replace(GV, "devicequotas", windowed, namespace=ns, subresource="status")

    table = await kube.request("GET", f"/apis/{GV}/namespaces/{ns}/devicequotas", extra_headers=[("Accept", TABLE)])
    assert table["kind"] == "Table", table
    names = [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0]
    assert names == ["Name", "Hard Memory", "Used Memory", "Reserved Memory", "Hard Devices", "Used Devices",
                     "Exceeded"]
    # The rest under -o wide (priority 1): the Table carries every cell, in definition order.
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names[len(names) - 8:] == ["Reserved Devices", "Pending Claims", "Enforcement", "Age",
                                      "Window", "In Force Memory", "In Force Devices", "Next Change"]
    rows = {row["cells"][0]: dict(zip(names, row["cells"], strict=False)) for row in table["rows"]}
    window = {k: rows["burst"][k] for k in ("Hard Memory", "Window", "In Force Memory", "Next Change")}
    assert window == {"Hard Memory": "320Gi", "Window": "deadline", "In Force Memory": "640Gi",
                      "Next Change": "2026-12-25T17:00:00Z"}
    assert rows["gpus"]["Window"] is None  # no windows: empty, as kubectl prints <none>
    assert (rows["gpus"]["Used Memory"], rows["gpus"]["Hard Memory"]) == ("282Gi", "200Gi")
    assert (rows["gpus"]["Exceeded"], rows["gpus"]["Pending Claims"]) == ("True", 3)
    # Not counted yet: empty cells, as kubectl prints <none>.
    assert (rows["fresh"]["Exceeded"], rows["fresh"]["Pending Claims"]) == (None, None)


async def test_examples_are_accepted_and_parse_the_same(
    kube: Kube, crd: dict[str, Any], make_namespace: Callable[..., Awaitable[str]]
) -> None:
    examples = [d for d in yaml.safe_load_all((ROOT / "examples/30-teams.yaml").read_text()) if d and d["kind"] == "DeviceQuota"]
    assert len(examples) >= 3
    namespaces: dict[str, str] = {}
    for example in examples:
        original = example["metadata"]["namespace"]
        if original not in namespaces:
            namespaces[original] = await make_namespace("dq")
        ns = namespaces[original]
        body = {**example, "metadata": {"name": example["metadata"]["name"], "namespace": ns}}
        stored = await kube.create(GV, "devicequotas", body, namespace=ns)
        # The server's defaulting (enforcement) must not change what the quota means.
        assert stored["spec"]["enforcement"] in ("Enforce", "Audit")
        assert parse_device_quota(stored) == parse_device_quota(body)
        assert parse_device_quota(stored).namespace == ns


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"hard": {"memory": "lots"}}, "spec.hard.memory"),
        ({"hard": {"memory": "-1Gi"}}, "spec.hard.memory"),
        ({"hard": {"memory": -5}}, "spec.hard.memory"),
        ({"hard": {"devices": -1}}, "spec.hard.devices"),
        ({"hard": {}}, "spec.hard"),
        ({"hard": {"cpu": "1"}}, "spec.hard"),
        ({"hard": {"devices": 1}, "enforcement": "Sometimes"}, "spec.enforcement"),
        ({"hard": {"devices": 1}, "pricing": "Cheap"}, "spec.pricing"),
        ({}, "spec.hard"),
        ({"hard": {"devices": 1}, "devices": {}}, "spec.devices"),
        ({"hard": {"devices": 1}, "devices": {"drivers": ["d" * 64]}}, "spec.devices.drivers[0]"),
        ({"hard": {"devices": 1}, "devices": {"drivers": ["a.example.com"] * 2}}, "spec.devices.drivers[1]"),
        ({"hard": {"devices": 1}, "devices": {"selectors": [{"cel": {"expression": "true"}}] * 9}},
         "spec.devices.selectors"),
        ({"hard": {"devices": 1}, "devices": {"selectors": [{}]}}, "spec.devices.selectors[0].cel"),
        ({"hard": {"devices": 1}, "devices": {"selectors": [{"cel": {"expression": "x" * 10241}}]}},
         "spec.devices.selectors[0].cel.expression"),
    ],
)
async def test_invalid_quotas_are_refused_naming_the_field(
    kube: Kube, crd: dict[str, Any], namespace: str, spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(ApiError) as refused:
        await kube.create(GV, "devicequotas", quota("bad", **spec), namespace=namespace)
    assert refused.value.status == 422
    assert field in str(refused.value.body)
    if "devices" in spec:  # the parser refuses the same spec.devices (`dra-quota check` reads files)
        with pytest.raises(QuotaError):
            parse_device_quota({"apiVersion": GV, **quota("bad", **spec), "metadata": {"name": "bad", "namespace": "ns"}})


async def test_default_enforcement_and_status_subresource(kube: Kube, crd: dict[str, Any], namespace: str) -> None:
    created = await kube.create(GV, "devicequotas", quota("gpus", hard={"memory": "320Gi", "devices": 8}), namespace=namespace)
    assert created["spec"]["enforcement"] == "Enforce"
    assert parse_device_quota(created).hard == Limits(memory=320 * 2**30, devices=8)
    status = {"used": {"memory": "240Gi", "devices": 3}, "reserved": {"memory": "80Gi", "devices": 1},
              "claims": {"allocated": 3, "pending": 1}}
    # A write of the main resource ignores status; only the subresource sets it.
    await kube.patch(GV, "devicequotas", "gpus", {"status": status}, namespace=namespace)
    assert "status" not in await kube.get(GV, "devicequotas", "gpus", namespace=namespace)
    await kube.patch(GV, "devicequotas", "gpus", {"status": status}, namespace=namespace, subresource="status")
    stored = await kube.get(GV, "devicequotas", "gpus", namespace=namespace)
    assert stored["status"]["used"] == {"memory": "240Gi", "devices": 3}
