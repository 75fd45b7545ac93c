"""quota.devices.memorysources, and how devices without a memory are charged.

The node: an NVIDIA GPU that publishes `memory`, a VFIO passthrough GPU that publishes
`addressableMemory`, a dranet RDMA NIC (no capacity) on the GPU's PCIe root, a Gaudi3
and a Gaudi of a model no memory source knows (both publish no capacity).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quota.accounting.ledger import Ledger
from quota.admission.admitter import Admitter
from quota.devices.inventory import Inventory
from quota.devices.memorysources import (
    NO_SOURCES,
    MemorySources,
    MemorySourcesError,
    default_memory_sources,
    load_memory_sources,
    parse_memory_sources,
)
from quota.objects.claims import parse_claim, parse_device_class
from quota.pricing.pricer import Pricer
from quota.quotas.devicequota import parse_device_quota
from quota.values.model import Charge, DeviceKey, Namespace

from ...builders import GiB, exactly, make_class, make_claim, make_device, make_quota, make_slice, request, result

NV, NIC, GAUDI = "gpu.nvidia.com", "dra.net", "gaudi.intel.com"
NS = Namespace("team-a")
ROOT = "resource.kubernetes.io/pcieRoot"


def slices() -> list[dict[str, Any]]:
    gpu = make_device("gpu-0", memory="80Gi", attrs={"type": "gpu", ROOT: "pci0000:17"})
    vfio = make_device("gpu-vfio-1", memory=None, attrs={"type": "vfio", ROOT: "pci0000:29"},
                       capacity={"addressableMemory": "94Gi"})
    rdma = make_device("pci-0000-18-00-1", memory=None, attrs={f"{NIC}/rdma": True, ROOT: "pci0000:17"})
    rdma["capacity"] = {}
    gaudi3 = make_device("0000-33-00-0-0x1060", memory=None, attrs={"model": "Gaudi3", ROOT: "pci0000:32"})
    gaudi4 = make_device("0000-44-00-0-0x1099", memory=None, attrs={"model": "Unknown", ROOT: "pci0000:43"})
    return [
        make_slice("nv", [gpu, vfio], driver=NV, node="node-1"),
        make_slice("net", [rdma], driver=NIC, node="node-1"),
        make_slice("gaudi", [gaudi3, gaudi4], driver=GAUDI, node="node-1"),
    ]


CLASSES = {c.name: c for c in map(parse_device_class, [
    make_class("gpu", f"device.driver == '{NV}' && device.attributes['{NV}'].type == 'gpu'"),
    make_class("vfio", f"device.driver == '{NV}' && device.attributes['{NV}'].type == 'vfio'"),
    make_class("rdma", f"device.driver == '{NIC}' && device.attributes['{NIC}'].rdma == true"),
    make_class("gaudi", f"device.driver == '{GAUDI}'"),
    make_class("empty", "device.driver == 'none.example.com'"),
])}


def inventory(sources: MemorySources | None = None) -> Inventory:
    inv = Inventory(default_memory_sources() if sources is None else sources)
    for obj in slices():
        inv.add_or_update_slice(obj)
    return inv


def admitter(*quotas: dict[str, Any], sources: MemorySources | None = None) -> Admitter:
    adm = Admitter(Pricer(inventory(sources), CLASSES), Ledger())
    for quota in quotas:
        adm.add_or_update_quota(parse_device_quota(quota))
    return adm


def claim(name: str, *requests: dict[str, Any], allocation: list[dict[str, Any]] | None = None) -> Any:
    return parse_claim(make_claim(name, *requests, allocation=allocation))


GPU_AND_NIC = (request("gpu", exactly("gpu")), request("nic", exactly("rdma")))
GAUDI3 = f"device.attributes['{GAUDI}'].model == 'Gaudi3'"


# -- the file ------------------------------------------------------------------------------


def test_sourced_devices_carry_their_memory_and_others_none() -> None:
    inv = inventory()

    def device(driver: str, pool: str, name: str) -> Any:
        found = inv.lookup(DeviceKey(driver, pool, name))
        assert found is not None
        return found

    vfio = device(NV, "node-1", "gpu-vfio-1")
    assert (vfio.memory, vfio.memory_name, vfio.is_accelerator) == (94 * GiB, "addressableMemory", True)
    gaudi3 = device(GAUDI, "node-1", "0000-33-00-0-0x1060")
    assert (gaudi3.memory, gaudi3.memory_name, gaudi3.is_accelerator) == (128 * GiB, None, True)
    # A listed driver's device no source applies to: an accelerator with no memory.
    unknown = device(GAUDI, "node-1", "0000-44-00-0-0x1099")
    assert (unknown.memory_capacity, unknown.is_accelerator) == (None, True)
    nic = device(NIC, "node-1", "pci-0000-18-00-1")
    assert (nic.memory_capacity, nic.is_accelerator) == (None, False)
    # The GPU that publishes `memory` is the parser's own object: no copy per device.
    gpu = device(NV, "node-1", "gpu-0")
    assert (gpu.memory, gpu.sourced_memory, gpu.is_accelerator) == (80 * GiB, None, True)
    # Without the sources, the VFIO GPU and the Gaudis are devices without a memory.
    bare = inventory(NO_SOURCES).lookup(DeviceKey(NV, "node-1", "gpu-vfio-1"))
    assert bare is not None and not bare.is_accelerator


def test_a_file_replaces_the_drivers_it_names_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "sources.yaml"
    path.write_text(f"""
apiVersion: draquota.io/v1alpha1
kind: MemorySources
drivers:
- name: {GAUDI}
  sources:
  - selector: device.attributes["{GAUDI}"].model == "Unknown"
    memory: 144Gi
""")
    sources = load_memory_sources([str(path)])
    assert len(sources.drivers[GAUDI]) == 1 and sources.drivers[NV] == default_memory_sources().drivers[NV]
    inv = inventory(sources)
    unknown, gaudi3 = (inv.lookup(DeviceKey(GAUDI, "node-1", n)) for n in ("0000-44-00-0-0x1099", "0000-33-00-0-0x1060"))
    assert unknown is not None and unknown.memory == 144 * GiB
    assert gaudi3 is not None and gaudi3.memory_capacity is None  # the shipped Gaudi3 entry was replaced
    assert load_memory_sources([str(path)], defaults=False).drivers.keys() == {GAUDI}


@pytest.mark.parametrize(("doc", "message"), [
    ({"apiVersion": "v1", "kind": "MemorySources"}, "expected apiVersion draquota.io/v1alpha1"),
    ({"drivers": [{"name": NV, "sources": [{"capacity": "a/b"}]}]}, "without a prefix"),
    ({"drivers": [{"name": NV, "sources": [{"selector": "device.driver == 1"}]}]}, "both a selector and a memory"),
    ({"drivers": [{"name": NV, "sources": [{"selector": "device.(", "memory": "1Gi"}]}]}, "selector"),
    ({"drivers": [{"name": NV, "sources": [{"selector": "true", "memory": "-1Gi"}]}]}, "must not be negative"),
    ({"drivers": [{"name": NV, "sources": [{"capacity": "x", "memory": "1Gi"}]}]}, "not both"),
    ({"drivers": [{"name": NV, "sources": []}, {"name": NV, "sources": []}]}, "listed twice"),
    ({"drivers": [{"name": NV, "sources": [{"capacity": "x", "typo": 1}]}]}, "unknown field(s) typo"),
])
def test_a_bad_file_is_refused_naming_the_field(doc: dict[str, Any], message: str) -> None:
    doc = {"apiVersion": "draquota.io/v1alpha1", "kind": "MemorySources", **doc}
    with pytest.raises(MemorySourcesError) as raised:
        parse_memory_sources(doc, "f.yaml")
    assert message in str(raised.value) and "f.yaml" in str(raised.value)


# -- a quota with no scope governs accelerators ---------------------------------------


def test_a_gpu_and_its_nic_are_charged_the_gpu_alone() -> None:
    adm = admitter(make_quota("q", memory="1Ti", devices=8))
    admitted = adm.admit_claim(claim("c", *GPU_AND_NIC), namespace_labels={})
    assert admitted.allowed and admitted.charge == Charge(80 * GiB, 1), admitted.reason
    assert adm.ledger.usage(NS, "q").reserved == Charge(80 * GiB, 1)
    assert admitted.warnings == ()


def test_a_nic_alone_is_not_charged_nor_counted() -> None:
    adm = admitter(make_quota("q", memory="1Ti", devices=8))
    admitted = adm.admit_claim(claim("c", request("nic", exactly("rdma"))), namespace_labels={})
    usage = adm.ledger.usage(NS, "q")
    assert admitted.allowed and admitted.charge == Charge() and admitted.warnings == ()
    assert (usage.reserved, usage.pending_claims) == (Charge(), 0)


def test_sourced_accelerators_are_charged_their_configured_memory() -> None:
    adm = admitter(make_quota("q", memory="1Ti"))
    vfio = adm.admit_claim(claim("v", request("g", exactly("vfio"))), namespace_labels={})
    gaudi = adm.admit_claim(claim("g", request("g", exactly("gaudi", GAUDI3))), namespace_labels={})
    assert (vfio.allowed, vfio.charge) == (True, Charge(94 * GiB, 1))
    assert (gaudi.allowed, gaudi.charge) == (True, Charge(128 * GiB, 1))


def test_an_accelerator_nothing_prices_is_denied_saying_what_the_admin_can_do() -> None:
    # A tenant who wants more accelerators cannot get one free by picking the model no
    # memory source knows: that device is an accelerator, unpriced, not a NIC.
    adm = admitter(make_quota("q", memory="1Ti"))
    unknown = f"device.attributes['{GAUDI}'].model == 'Unknown'"
    denied = adm.admit_claim(claim("c", request("g", exactly("gaudi", unknown))), namespace_labels={})
    assert not denied.allowed
    assert "cannot be priced" in denied.reason and f"configure a memory source for driver {GAUDI}" in denied.reason
    assert "Publish the devices" not in denied.reason
    # Any Gaudi: the largest known one prices it (Conservative), so it is admitted.
    assert adm.admit_claim(claim("d", request("g", exactly("gaudi"))), namespace_labels={}).charge == \
        Charge(128 * GiB, 1)


def test_a_class_with_no_device_at_all_is_still_denied_plainly() -> None:
    denied = admitter(make_quota("q", memory="1Ti")).admit_claim(claim("c", request("e", exactly("empty"))),
                                                                 namespace_labels={})
    assert not denied.allowed and "class empty has no device at all" in denied.reason
    assert "scope DeviceQuota \"q\"" in denied.reason


# -- a quota whose scope names the NIC ------------------------------------------------


@pytest.mark.parametrize("quota", [
    make_quota("nics", memory="1Ti", devices=4, classes=["rdma"]),
    make_quota("nics", memory="1Ti", devices=4, drivers=[NIC]),
])
def test_a_quota_naming_the_nic_counts_it_at_0_memory_with_a_warning(quota: dict[str, Any]) -> None:
    adm = admitter(quota, make_quota("gpus", memory="1Ti"))
    admitted = adm.admit_claim(claim("c", *GPU_AND_NIC), namespace_labels={})
    assert admitted.allowed, admitted.reason
    assert adm.ledger.usage(NS, "nics").reserved == Charge(0, 1)
    assert adm.ledger.usage(NS, "gpus").reserved == Charge(80 * GiB, 1)
    (warning,) = admitted.warnings
    assert 'DeviceQuota "nics"' in warning and f"driver {NIC}" in warning and "memory source" in warning


# -- allocated: exact ---------------------------------------------------------------------


def test_an_allocated_gpu_and_nic_are_charged_the_gpu_and_recorded_whole() -> None:
    adm = admitter(make_quota("q", memory="1Ti", devices=8), make_quota("nics", devices=4, classes=["rdma"]))
    allocated = claim("c", *GPU_AND_NIC, allocation=[result("gpu", "gpu-0", driver=NV),
                                                     result("nic", "pci-0000-18-00-1", driver=NIC)])
    admission = adm.account_allocated(allocated)
    assert admission.charge == Charge(80 * GiB, 1)
    assert adm.ledger.usage(NS, "q").used == Charge(80 * GiB, 1)
    assert adm.ledger.usage(NS, "nics").used == Charge(0, 1)
    record = {str(k): v for k, v in adm.pricer.allocation_record(allocated).items()}
    assert record == {f"gpu:{NV}/node-1/gpu-0": 80 * GiB, f"nic:{NIC}/node-1/pci-0000-18-00-1": 0}


def test_an_allocated_sourced_device_is_charged_its_sourced_memory() -> None:
    adm = admitter(make_quota("q", memory="1Ti"))
    allocated = claim("c", request("g", exactly("gaudi")),
                      allocation=[result("g", "0000-33-00-0-0x1060", driver=GAUDI)])
    assert adm.account_allocated(allocated).charge == Charge(128 * GiB, 1)


