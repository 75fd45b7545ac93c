"""ResourceSlices as real DRA drivers publish them, for tests and benchmarks (never fetched code).

Each builder returns the slices of one node's pool, built as the driver's code builds them
(names, attributes, capacities, counter sets; values from the devices they describe):
- kubernetes-sigs/dra-example-driver, internal/profiles/gpu/gpu.go (`--gpu-partitions`):
  per GPU a counter set `gpu-<i>-counters` {memory: 80Gi, compute: 100}, partitions
  `gpu-<i>-partition-<j>` consuming 80Gi/N and 100/N of it, and `gpu-<i>-full` consuming
  all of it; counters in one slice of the node's pool, devices in another; its DeviceClass
  selects `device.driver == 'gpu.example.com'`
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

EXAMPLE, AMD, NVIDIA = "gpu.example.com", "gpu.amd.com", "gpu.nvidia.com"
Obj = dict[str, Any]


def node_slice(name: str, node: str, driver: str, slices: int, **spec: Any) -> Obj:
    """One slice of `node`'s pool (named after the node) out of `slices`."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": slices}, **spec}}


def attrs(**values: Any) -> Obj:
    kinds = {bool: "bool", int: "int", str: "string"}
    return {k: {kinds[type(v)]: v} for k, v in values.items()}


def example_partitionable(node: str, gpus: int = 8, partitions: int = 4, driver: str = EXAMPLE) -> list[Obj]:
    counter_sets: dict[str, dict[str, str]] = {}
    devices: list[Obj] = []
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
    return [node_slice(f"{node}-counters", node, driver, 2, sharedCounters=shared(counter_sets)),
            node_slice(f"{node}-devices", node, driver, 2, devices=devices)]


def shared(counter_sets: dict[str, dict[str, str]]) -> list[Obj]:
    return [{"name": name, "counters": {k: {"value": v} for k, v in counters.items()}}
            for name, counters in counter_sets.items()]


def amd_mi300x(node: str, gpus: int, cpx: bool) -> list[Obj]:
    """SPX: one `amdgpu` per card; CPX: eight `amdgpu-partition`s per card, naming their parent."""
    devices: list[Obj] = []
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
    return [node_slice(f"{node}-amd", node, AMD, 1, devices=devices)]


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


def nvidia_dynamic_mig(node: str, gpus: int = 2) -> list[Obj]:
    counter_sets: dict[str, dict[str, str]] = {}
    devices: list[Obj] = []
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
    return [node_slice(f"{node}-counters", node, NVIDIA, 2, sharedCounters=shared(counter_sets)),
            node_slice(f"{node}-devices", node, NVIDIA, 2, devices=devices)]
