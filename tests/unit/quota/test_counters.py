"""`All` and partitionable devices priced over what real drivers publish (quota.counters).

Fixtures are built as the drivers' code builds their ResourceSlices (names, attributes,
capacities, counter sets as published; values from the devices they describe):
- kubernetes-sigs/dra-example-driver, internal/profiles/gpu/gpu.go (`--gpu-partitions`):
  per GPU a counter set `gpu-<i>-counters` {memory: 80Gi, compute: 100}, partitions
  `gpu-<i>-partition-<j>` consuming 80Gi/N and 100/N of it, and `gpu-<i>-full` consuming
  all of it; counters in one slice of the node's pool, devices in another; DeviceClass
  `gpu.example.com` selects `device.driver == 'gpu.example.com'`
  (deployments/helm/dra-example-driver/templates/deviceclass.yaml);
- ROCm/k8s-gpu-dra-driver, cmd/gpu-kubeletplugin/{deviceinfo,discovery}.go: an MI300X in
  SPX is one `amdgpu` device, in CPX (+NPS4) eight `amdgpu-partition` devices, no
  counters; `memory` is amdsmi's vramBytes (192Gi, a CPX partition an eighth of it);
  DeviceClass `gpu.amd.com` (helm-charts-k8s/templates/deviceclass.yaml);
- kubernetes-sigs/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin/{partitions,mig}.go
  (DynamicMIG): per GPU a counter set `gpu-<minor>-counter-set` holding the largest MIG
  profile's capacities in dash form plus `memory-slice-<i>` = 1; the full GPU `gpu-<minor>`
  consumes all of it, each MIG placement `gpu-<minor>-mig-<profile>-<id>-<start>` its
  profile's capacities and the memory slices it sits on; A100-SXM4-80GB profiles
  (nvidia-smi mig -lgip): 1g.10gb x7, 2g.20gb x3, 3g.40gb x2, 4g.40gb, 7g.80gb.
"""

from __future__ import annotations

from typing import Any

import pytest

from quota.claims import parse_claim, parse_device_class
from quota.inventory import Inventory
from quota.model import Charge, DeviceClassName, Mode
from quota.pricing import Pricer

from ..builders import GiB, MiB, exactly, make_class, make_claim, make_counter_slice, make_slice, request

EXAMPLE, AMD, NVIDIA = "gpu.example.com", "gpu.amd.com", "gpu.nvidia.com"


def attrs(**values: Any) -> dict[str, Any]:
    kinds = {bool: "bool", int: "int", str: "string"}
    return {k: {kinds[type(v)]: v} for k, v in values.items()}


def example_partitionable(inv: Inventory, node: str, gpus: int = 8, partitions: int = 4) -> None:
    counter_sets: dict[str, dict[str, str]] = {}
    devices: list[dict[str, Any]] = []
    for i in range(gpus):
        common = attrs(index=i, uuid=f"gpu-{node}-{i}", model="LATEST-GPU-MODEL")
        common["driverVersion"] = {"version": "1.0.0"}
        counter_set = f"gpu-{i}-counters"
        counter_sets[counter_set] = {"memory": "80Gi", "compute": "100"}
        part_memory, part_compute = f"{80 * 1024 // partitions}Mi", str(100 // partitions)
        for j in range(partitions):
            devices.append({
                "name": f"gpu-{i}-partition-{j}",
                "attributes": {**common, **attrs(partition=j, partitionable=True)},
                "capacity": {"memory": {"value": part_memory}, "compute": {"value": part_compute}},
                "consumesCounters": [{"counterSet": counter_set, "counters": {
                    "memory": {"value": part_memory}, "compute": {"value": part_compute}}}],
            })
        devices.append({
            "name": f"gpu-{i}-full",
            "attributes": {**common, **attrs(partitionable=True, full=True)},
            "capacity": {"memory": {"value": "80Gi"}, "compute": {"value": "100"}},
            "consumesCounters": [{"counterSet": counter_set, "counters": {
                "memory": {"value": "80Gi"}, "compute": {"value": "100"}}}],
        })
    inv.add_or_update_slice(make_counter_slice(f"{node}-counters", counter_sets, driver=EXAMPLE, node=node))
    inv.add_or_update_slice(make_slice(f"{node}-devices", devices, driver=EXAMPLE, node=node, count=2))


def amd_mi300x(inv: Inventory, node: str, gpus: int, cpx: bool) -> None:
    """SPX: one `amdgpu` per card; CPX: eight `amdgpu-partition`s per card, naming their parent."""
    devices: list[dict[str, Any]] = []
    kind, prefix, memory, cus, profile = (("amdgpu-partition", "parent", "24Gi", 38, "cpx_nps4") if cpx
                                          else ("amdgpu", "", "192Gi", 304, "spx_nps1"))
    render = 128
    for card in range(gpus):
        for _ in range(8 if cpx else 1):
            ids = {("parentPciAddr" if cpx else "pciAddr"): f"0000:{card + 0x11:02x}:00.0",
                   (f"{prefix}DeviceID" if cpx else "deviceID"): f"{card:016x}"}
            devices.append({
                "name": f"gpu-{card}-{render}",
                "attributes": {**attrs(productName="AMD Instinct MI300X", family="AI", type=kind, cardIndex=card,
                                       renderIndex=render, partitionProfile=profile,
                                       driverSrcVersion="C8C8A4E8BF3A7C8E2D17A3A", **ids),
                               "driverVersion": {"version": "6.12.12"}},
                "capacity": {"memory": {"value": memory}, "computeUnits": {"value": str(cus)},
                             "simdUnits": {"value": str(cus * 4)}},
            })
            render += 1
    inv.add_or_update_slice(make_slice(f"{node}-amd", devices, driver=AMD, node=node))


# profile: (profile id, placements (start, size), memory MiB, multiprocessors, copy engines, decoders, jpeg, ofa)
A100_80GB_MIG = {
    "1g.10gb": (19, [(s, 1) for s in range(7)], 9856, 14, 1, 0, 0, 0),
    "2g.20gb": (14, [(0, 2), (2, 2), (4, 2)], 19968, 28, 2, 1, 0, 0),
    "3g.40gb": (9, [(0, 4), (4, 4)], 40192, 42, 3, 2, 0, 0),
    "4g.40gb": (5, [(0, 4)], 40192, 56, 4, 2, 0, 0),
    "7g.80gb": (0, [(0, 8)], 80896, 98, 7, 5, 1, 1),
}


def mig_counters(memory: int, sms: int, copy: int, dec: int, jpeg: int, ofa: int, slices: range) -> dict[str, str]:
    counters = {"memory": f"{memory}Mi", "multiprocessors": str(sms), "copy-engines": str(copy),
                "decoders": str(dec), "encoders": "0", "jpeg-engines": str(jpeg), "ofa-engines": str(ofa)}
    return {**counters, **{f"memory-slice-{i}": "1" for i in slices}}


def nvidia_dynamic_mig(inv: Inventory, node: str, gpus: int = 2) -> None:
    counter_sets: dict[str, dict[str, str]] = {}
    devices: list[dict[str, Any]] = []
    largest = A100_80GB_MIG["7g.80gb"]
    for minor in range(gpus):
        common = attrs(productName="NVIDIA A100-SXM4-80GB", brand="Nvidia", architecture="Ampere",
                       uuid=f"GPU-{node}-{minor}")
        counter_set = f"gpu-{minor}-counter-set"
        full = mig_counters(*largest[2:], range(8))
        counter_sets[counter_set] = full
        devices.append({
            "name": f"gpu-{minor}", "attributes": {**common, **attrs(type="gpu")},
            "capacity": {"memory": {"value": f"{largest[2]}Mi"}, "multiprocessors": {"value": str(largest[3])}},
            "consumesCounters": [{"counterSet": counter_set,
                                  "counters": {k: {"value": v} for k, v in full.items()}}],
        })
        for profile, (pid, placements, memory, sms, copy, dec, jpeg, ofa) in A100_80GB_MIG.items():
            for start, size in placements:
                used = mig_counters(memory, sms, copy, dec, jpeg, ofa, range(start, start + size))
                devices.append({
                    "name": f"gpu-{minor}-mig-{profile.replace('.', '')}-{pid}-{start}",
                    "attributes": {**common, **attrs(type="mig", profile=profile, parentUUID=f"GPU-{node}-{minor}")},
                    "capacity": {"memory": {"value": f"{memory}Mi"}, "multiprocessors": {"value": str(sms)}},
                    "consumesCounters": [{"counterSet": counter_set,
                                          "counters": {k: {"value": v} for k, v in used.items()}}],
                })
    inv.add_or_update_slice(make_counter_slice(f"{node}-counters", counter_sets, driver=NVIDIA, node=node))
    inv.add_or_update_slice(make_slice(f"{node}-devices", devices, driver=NVIDIA, node=node, count=2))


CLASSES = {c.name: c for c in map(parse_device_class, [
    make_class(EXAMPLE, f"device.driver == '{EXAMPLE}'"),
    make_class(AMD, f"device.driver == '{AMD}'"),
    make_class("gpu.nvidia.com", f"device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}'].type == 'gpu'"),
    make_class("mig.nvidia.com", f"device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}'].type == 'mig'"),
])}


def price(inv: Inventory, cls: str, *selectors: str, count: int | None = None, all_mode: bool = False,
          mode: Mode = "conservative") -> tuple[Charge, tuple[str, ...]]:
    spec = parse_claim(make_claim("c", request("r", exactly(cls, *selectors, count=count,
                                                            mode="All" if all_mode else None)))).spec
    pricing = Pricer(inv, CLASSES).estimate(spec, mode=mode)
    assert pricing.errors == ()
    return pricing.total, pricing.warnings


def test_all_on_a_partitionable_node_is_charged_what_its_counters_allow_together() -> None:
    """dra-example-driver, 8 GPUs x (4 partitions + the full GPU): 40 devices publishing
    1,280Gi on a node with 640Gi. They cannot all be allocated together (a full GPU and
    its partitions draw on one counter set), so the scheduler cannot satisfy the request;
    it is charged the most the counters let be allocated at once, with a warning."""
    inv = Inventory()
    example_partitionable(inv, "node-1")
    charge, warnings = price(inv, EXAMPLE, all_mode=True)
    assert charge == Charge(640 * GiB, 32)
    assert any("no node can allocate all the devices this request matches together (40 on the largest)" in w
               for w in warnings), warnings
    # All of the partitions only: they fit together, and that is what the scheduler allocates.
    partitions = f"!has(device.attributes['{EXAMPLE}'].full)"
    assert price(inv, EXAMPLE, partitions, all_mode=True) == (Charge(640 * GiB, 32), ())


def test_exact_count_over_partitions_is_capped_by_what_fits_together_on_one_node() -> None:
    """The example driver's demo claim (count 2, demo/examples/partitionable-devices) is two
    full GPUs; 9 devices cannot be 9 full GPUs on an 8-GPU node: at most 7 full GPUs and two
    partitions of the eighth."""
    inv = Inventory()
    example_partitionable(inv, "node-1")
    assert price(inv, EXAMPLE, count=2) == (Charge(160 * GiB, 2), ())
    assert price(inv, EXAMPLE, count=9) == (Charge((7 * 80 + 2 * 20) * GiB, 9), ())
    assert price(inv, EXAMPLE, count=9, mode="optimistic")[0] == Charge(9 * 20 * GiB, 9)


def test_all_takes_each_dimension_from_the_node_with_the_most() -> None:
    """8 MI300X whole on one node, 2 split into 16 CPX partitions on another: the scheduler
    may put an All claim on either, so it is charged the first node's memory and the
    second node's device count (a devices: 12 quota refuses it); Optimistic the least of each."""
    inv = Inventory()
    amd_mi300x(inv, "spx-node", 8, cpx=False)
    amd_mi300x(inv, "cpx-node", 2, cpx=True)
    assert price(inv, AMD, all_mode=True) == (Charge(8 * 192 * GiB, 16), ())
    assert price(inv, AMD, all_mode=True, mode="optimistic") == (Charge(16 * 24 * GiB, 8), ())


def test_all_skips_a_node_that_cannot_host_it() -> None:
    """A node whose candidates do not fit their counters together cannot host the All claim:
    its sums do not count when another node can."""
    inv = Inventory()
    example_partitionable(inv, "partitioned", gpus=8)
    plain = make_slice("plain", [{"name": f"gpu-{i}", "capacity": {"memory": {"value": "80Gi"}}}
                                    for i in range(2)], driver=EXAMPLE, node="plain")
    inv.add_or_update_slice(plain)
    assert price(inv, EXAMPLE, all_mode=True) == (Charge(160 * GiB, 2), ())


def test_dynamic_mig_placements_are_charged_within_the_memory_slices() -> None:
    """NVIDIA DynamicMIG, two A100-80GB: every MIG placement of a GPU overlaps another, so an
    All over mig.nvidia.com fits nowhere: charged the largest layout per GPU (7g.80gb's
    memory; seven 1g.10gb devices). Three devices of the largest profile do not fit two
    GPUs: a 7g.80gb and two 3g.40gb beside it."""
    inv = Inventory()
    nvidia_dynamic_mig(inv, "node-1", gpus=2)
    charge, warnings = price(inv, "mig.nvidia.com", all_mode=True)
    assert charge == Charge(2 * 80896 * MiB, 14) and warnings
    assert price(inv, "gpu.nvidia.com", all_mode=True) == (Charge(2 * 80896 * MiB, 2), ())
    assert price(inv, "mig.nvidia.com", count=2) == (Charge(2 * 80896 * MiB, 2), ())
    assert price(inv, "mig.nvidia.com", count=3) == (Charge((80896 + 2 * 40192) * MiB, 3), ())
    one_g = f"device.attributes['{NVIDIA}'].profile == '1g.10gb'"
    assert price(inv, "mig.nvidia.com", one_g, count=8) == (Charge(8 * 9856 * MiB, 8), ())


def test_a_request_no_node_can_hold_keeps_what_it_asks() -> None:
    """ExactCount over partitions that no node can give `count` of at once: the claim waits
    for the inventory to change; it keeps `count` x the largest, with a warning."""
    inv = Inventory()
    example_partitionable(inv, "node-1", gpus=1)
    charge, warnings = price(inv, EXAMPLE, count=5)
    assert charge == Charge(5 * 80 * GiB, 5)
    assert "request r: no node can allocate 5 of the matching devices together within their shared counters now" \
        in warnings


@pytest.mark.parametrize("cls", [DeviceClassName(EXAMPLE), DeviceClassName("mig.nvidia.com")])
def test_the_stored_claims_bound_stays_above_the_estimate(cls: DeviceClassName) -> None:
    inv = Inventory()
    example_partitionable(inv, "node-1")
    nvidia_dynamic_mig(inv, "node-2")
    spec = parse_claim(make_claim("c", request("r", exactly(cls, mode="All")))).spec
    pricer = Pricer(inv, CLASSES)
    bound, estimate = pricer.upper_bound(spec).total, pricer.estimate(spec).total
    assert bound.memory >= estimate.memory and bound.devices >= estimate.devices
