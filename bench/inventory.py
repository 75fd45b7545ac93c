"""Deterministic synthetic DRA inventory and claims for benchmarks and tests.

What it models: a large GPU cluster whose nodes run the NVIDIA DRA driver
(`gpu.nvidia.com`, kubernetes-sigs/dra-driver-nvidia-gpu) and publish one
`resource.k8s.io/v1` ResourceSlice per node (pool name = node name, generation 1,
resourceSliceCount 1, `nodeName` set), with the attribute and capacity names that driver
publishes (see `examples/10-nvidia-slices.yaml`). Node kinds, in a fixed repeating
pattern of ten nodes so that any prefix of five nodes already holds every kind:

=========  ====  ========================================================================
kind       share  devices per node (``gpus_per_node`` = G)
=========  ====  ========================================================================
h100       40 %  G x "NVIDIA H100 80GB HBM3" (Hopper, cc 9.0.0, memory 80Gi)
h200       20 %  G x "NVIDIA H200" (Hopper, cc 9.0.0, memory 141Gi)
a100       20 %  G x "NVIDIA A100-SXM4-40GB" (Ampere, cc 8.0.0, memory 40Gi)
a100-mig   10 %  G A100-40GB GPUs in MIG mode, each split (alternating per GPU) into
                 7 x 1g.5gb (4864Mi) or 3g.20gb (19968Mi) + 2g.10gb (9984Mi) + 2 x 1g.5gb;
                 only the MIG devices are published (static MIG)
l40s       10 %  G x "NVIDIA L40S" (Ada Lovelace, cc 8.9.0, memory 48Gi) published with
                 ConsumableShares (``allowMultipleAllocations: true`` and a memory
                 requestPolicy: default 48Gi, validRange 1Mi..48Gi step 1Mi)
=========  ====  ========================================================================

With the defaults (5,000 nodes x 8 GPUs) that is 40,000 physical GPUs published as
58,000 devices (the 500 MIG nodes publish 44 MIG devices each instead of 8 GPUs).
A slice never holds more than 128 devices (a node with more GPUs gets several slices,
and `resourceSliceCount` says how many).

Everything is a plain dict exactly as ``json.loads`` of the API object would give it
(quantities as strings, versions as semver strings). All functions are pure and
deterministic for a given seed: no I/O, no global random state, no clock.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Final

from quota.devices.inventory import gc_paused

__all__ = [
    "NVIDIA_DRIVER",
    "AMD_DRIVER",
    "GPU_MODELS",
    "MIG_PROFILES",
    "generate_slices",
    "generate_device_classes",
    "generate_claims",
    "generate_namespaces",
    "node_kind",
    "node_name",
    "nvidia_gpu_device",
    "nvidia_mig_device",
    "consumable_memory_policy",
]

JSON = dict[str, Any]

NVIDIA_DRIVER: Final = "gpu.nvidia.com"
AMD_DRIVER: Final = "gpu.amd.com"
RESOURCE_API: Final = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE: Final = 128
ADMIN_ACCESS_LABEL: Final = "resource.kubernetes.io/admin-access"

_MI: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A full NVIDIA GPU as the driver describes it."""

    product_name: str
    architecture: str
    compute_capability: str
    memory_mib: int
    multiprocessors: int


GPU_MODELS: Final[dict[str, GpuModel]] = {
    "h100": GpuModel("NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", 80 * 1024, 132),
    "h200": GpuModel("NVIDIA H200", "Hopper", "9.0.0", 141 * 1024, 132),
    "a100": GpuModel("NVIDIA A100-SXM4-40GB", "Ampere", "8.0.0", 40 * 1024, 108),
    "l40s": GpuModel("NVIDIA L40S", "Ada Lovelace", "8.9.0", 48 * 1024, 142),
}


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A static MIG profile on an A100-40GB: GPU-instance profile id, memory, engines."""

    name: str
    profile_id: int
    memory_mib: int
    slices: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    jpeg_engines: int
    ofa_engines: int


MIG_PROFILES: Final[dict[str, MigProfile]] = {
    "1g.5gb": MigProfile("1g.5gb", 19, 4864, 1, 14, 1, 0, 0, 0),
    "2g.10gb": MigProfile("2g.10gb", 14, 9984, 2, 28, 2, 1, 0, 0),
    "3g.20gb": MigProfile("3g.20gb", 9, 19968, 4, 42, 3, 2, 0, 0),
}

# MIG layouts of one A100-40GB: (profile, placement start) pairs; each is a valid
# combination of placements on the GPU's 8 memory slices.
_MIG_LAYOUTS: Final[tuple[tuple[tuple[str, int], ...], ...]] = (
    tuple(("1g.5gb", start) for start in range(7)),
    (("2g.10gb", 0), ("1g.5gb", 2), ("1g.5gb", 3), ("3g.20gb", 4)),
)

# Ten-node repeating pattern: 4 h100, 2 h200, 2 a100, 1 a100-mig, 1 l40s.
_NODE_PATTERN: Final[tuple[str, ...]] = (
    "h100", "h200", "a100", "a100-mig", "l40s", "h100", "h100", "h200", "a100", "h100",
)

_DRIVER_VERSIONS: Final[tuple[tuple[str, str], ...]] = (
    # (driverVersion, cudaDriverVersion) pairs seen on real nodes. Version attributes
    # must be strict semver (the API server rejects "580.95.05"), so the leading zeros
    # of NVIDIA's patch numbers are dropped, as the driver does when it publishes.
    ("580.126.20", "13.0.0"),
    ("580.95.5", "13.0.0"),
    ("570.195.3", "12.8.0"),
)


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _mib(n: int) -> str:
    """A MiB count as the apiserver serializes it (canonical binary-SI form)."""
    if n % 1024 == 0:
        return f"{n // 1024}Gi"
    return f"{n}Mi"


def consumable_memory_policy(memory_mib: int) -> JSON:
    """The memory requestPolicy the NVIDIA driver's ConsumableShares feature publishes."""
    return {
        "default": _mib(memory_mib),
        "validRange": {"min": "1Mi", "max": _mib(memory_mib), "step": "1Mi"},
    }


def _pci(bus: int) -> tuple[str, str]:
    """(pciBusID, pcieRoot) for a GPU on PCI bus `bus`."""
    return f"0000:{bus:02x}:00.0", f"pci0000:{max(bus - 1, 0):02x}"


def _gpu_attributes(
    model: GpuModel, driver_version: str, cuda_driver_version: str, bus_id: str, root: str, numa_node: int
) -> JSON:
    """Attributes a full GPU publishes and its MIG devices inherit from it."""
    return {
        "productName": {"string": model.product_name},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": model.architecture},
        "cudaComputeCapability": {"version": model.compute_capability},
        "driverVersion": {"version": driver_version},
        "cudaDriverVersion": {"version": cuda_driver_version},
        "resource.kubernetes.io/pciBusID": {"string": bus_id},
        "resource.kubernetes.io/pcieRoot": {"string": root},
        "resource.kubernetes.io/numaNode": {"int": numa_node},
    }


def nvidia_gpu_device(
    *,
    index: int,
    model: GpuModel,
    uuid: str,
    driver_version: str = "580.126.20",
    cuda_driver_version: str = "13.0.0",
    pci_bus: int = 0x18,
    numa_node: int = 0,
    consumable_shares: bool = False,
) -> JSON:
    """A full GPU (`type: gpu`) as published by gpu.nvidia.com."""
    bus_id, root = _pci(pci_bus)
    capacity: JSON = {"memory": {"value": _mib(model.memory_mib)}}
    device: JSON = {
        "name": f"gpu-{index}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{uuid}"},
            **_gpu_attributes(model, driver_version, cuda_driver_version, bus_id, root, numa_node),
        },
        "capacity": capacity,
    }
    if consumable_shares:
        device["allowMultipleAllocations"] = True
        capacity["memory"]["requestPolicy"] = consumable_memory_policy(model.memory_mib)
    return device


def nvidia_mig_device(
    *,
    parent_index: int,
    parent_model: GpuModel,
    parent_uuid: str,
    profile: MigProfile,
    start: int,
    uuid: str,
    driver_version: str = "580.126.20",
    cuda_driver_version: str = "13.0.0",
    pci_bus: int = 0x18,
    numa_node: int = 0,
) -> JSON:
    """A static MIG device (`type: mig`), named gpu-<minor>-mig-<profileId>-<start>-<size>."""
    bus_id, root = _pci(pci_bus)
    return {
        "name": f"gpu-{parent_index}-mig-{profile.profile_id}-{start}-{profile.slices}",
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": f"MIG-{uuid}"},
            "parentUUID": {"string": f"GPU-{parent_uuid}"},
            "profile": {"string": profile.name},
            **_gpu_attributes(parent_model, driver_version, cuda_driver_version, bus_id, root, numa_node),
        },
        "capacity": {
            "memory": {"value": _mib(profile.memory_mib)},
            "multiprocessors": {"value": str(profile.multiprocessors)},
            "copyEngines": {"value": str(profile.copy_engines)},
            "decoders": {"value": str(profile.decoders)},
            "encoders": {"value": "0"},
            "jpegEngines": {"value": str(profile.jpeg_engines)},
            "ofaEngines": {"value": str(profile.ofa_engines)},
        },
    }


_PCI_BUSES: Final[tuple[int, ...]] = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def _node_devices(kind: str, gpus: int, rng: random.Random) -> list[JSON]:
    driver_version, cuda_version = _DRIVER_VERSIONS[rng.randrange(len(_DRIVER_VERSIONS))]
    devices: list[JSON] = []
    for i in range(gpus):
        bus = _PCI_BUSES[i % len(_PCI_BUSES)] + (i // len(_PCI_BUSES))
        bus &= 0xFF
        numa = 0 if i < gpus // 2 or gpus == 1 else 1
        gpu_uuid = _uuid(rng)
        if kind == "a100-mig":
            model = GPU_MODELS["a100"]
            for profile_name, start in _MIG_LAYOUTS[i % len(_MIG_LAYOUTS)]:
                devices.append(
                    nvidia_mig_device(
                        parent_index=i,
                        parent_model=model,
                        parent_uuid=gpu_uuid,
                        profile=MIG_PROFILES[profile_name],
                        start=start,
                        uuid=_uuid(rng),
                        driver_version=driver_version,
                        cuda_driver_version=cuda_version,
                        pci_bus=bus,
                        numa_node=numa,
                    )
                )
        else:
            devices.append(
                nvidia_gpu_device(
                    index=i,
                    model=GPU_MODELS[kind],
                    uuid=gpu_uuid,
                    driver_version=driver_version,
                    cuda_driver_version=cuda_version,
                    pci_bus=bus,
                    numa_node=numa,
                    consumable_shares=kind == "l40s",
                )
            )
    return devices


def node_kind(index: int) -> str:
    """The kind of node number `index` (see the module docstring)."""
    return _NODE_PATTERN[index % len(_NODE_PATTERN)]


def node_name(index: int) -> str:
    return f"{node_kind(index)}-node-{index:05d}"


def generate_slices(nodes: int = 5000, gpus_per_node: int = 8, seed: int = 0) -> list[JSON]:
    """ResourceSlices of `nodes` NVIDIA GPU nodes, one pool per node (pool = node name).

    Deterministic for a given (nodes, gpus_per_node, seed); node i has the same kind for
    every seed, the seed changes UUIDs and driver versions. Device UUIDs are unique.
    """
    if nodes < 0 or gpus_per_node < 0:
        raise ValueError("nodes and gpus_per_node must be >= 0")
    with gc_paused():
        return _generate_slices(nodes, gpus_per_node, seed)


def _generate_slices(nodes: int, gpus_per_node: int, seed: int) -> list[JSON]:
    rng = random.Random(seed)
    slices: list[JSON] = []
    for n in range(nodes):
        name = node_name(n)
        devices = _node_devices(node_kind(n), gpus_per_node, rng)
        chunks = [
            devices[i : i + MAX_DEVICES_PER_SLICE]
            for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)
        ] or [[]]
        for c, chunk in enumerate(chunks):
            slices.append(
                {
                    "apiVersion": RESOURCE_API,
                    "kind": "ResourceSlice",
                    "metadata": {
                        "name": f"{name}-{NVIDIA_DRIVER}-{c}",
                        "uid": _uuid(rng),
                        "resourceVersion": "1",
                    },
                    "spec": {
                        "driver": NVIDIA_DRIVER,
                        "pool": {
                            "name": name,
                            "generation": 1,
                            "resourceSliceCount": len(chunks),
                        },
                        "nodeName": name,
                        "devices": chunk,
                    },
                }
            )
    return slices


def _device_class(name: str, expression: str, extended: str | None = None) -> JSON:
    spec: JSON = {"selectors": [{"cel": {"expression": expression}}]}
    if extended is not None:
        spec["extendedResourceName"] = extended
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def generate_device_classes() -> list[JSON]:
    """The DeviceClasses of examples/00-deviceclasses.yaml, in the same order."""
    return [
        _device_class(
            "gpu.nvidia.com",
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
            "nvidia.com/gpu",
        ),
        _device_class(
            "mig.nvidia.com",
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
        ),
        _device_class(
            "shared.gpu.nvidia.com",
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
            " && device.allowMultipleAllocations",
        ),
        _device_class("gpu.amd.com", "device.driver == 'gpu.amd.com'"),
    ]


# --------------------------------------------------------------------------- claims


@dataclass(slots=True)
class _Dev:
    """A device of the generated inventory, as far as claims need it."""

    pool: str
    name: str
    kind: str
    product: str
    profile: str
    memory_mib: int


@dataclass(slots=True)
class _Node:
    """The still-free devices of one kind on one node."""

    devices: list[_Dev]
    touched: bool = False


def _index(slices: list[JSON]) -> dict[str, list[_Node]]:
    """Free devices by kind key ("h100", ..., "mig:1g.5gb"), grouped per node."""
    per_node: dict[str, dict[str, list[_Dev]]] = {}
    for s in slices:
        spec = s.get("spec", {})
        if spec.get("driver") != NVIDIA_DRIVER:
            continue
        pool = spec["pool"]["name"]
        for d in spec.get("devices", []):
            attrs = d.get("attributes", {})
            kind_attr = attrs.get("type", {}).get("string")
            product = attrs.get("productName", {}).get("string", "")
            mem = d.get("capacity", {}).get("memory", {}).get("value", "0")
            mib = int(mem[:-2]) * (1024 if mem.endswith("Gi") else 1) if mem[-2:] in ("Gi", "Mi") else 0
            if kind_attr == "mig":
                profile = attrs["profile"]["string"]
                key = f"mig:{profile}"
            else:
                profile = ""
                key = next((k for k, m in GPU_MODELS.items() if m.product_name == product), product)
            dev = _Dev(pool, d["name"], key, product, profile, mib)
            per_node.setdefault(key, {}).setdefault(pool, []).append(dev)
    return {k: [_Node(devs) for devs in nodes.values()] for k, nodes in per_node.items()}


def _selector(expression: str) -> JSON:
    return {"cel": {"expression": expression}}


def _product_selector(product: str) -> JSON:
    return _selector(f"device.attributes['gpu.nvidia.com'].productName == '{product}'")


_CLAIM_KINDS: Final[tuple[tuple[str, int], ...]] = (
    # (kind, weight in percent)
    ("class", 25),
    ("product", 20),
    ("memory", 10),
    ("cc", 10),
    ("mig", 12),
    ("first", 8),
    ("all", 4),
    ("admin", 3),
    ("shared", 8),
)
_COUNTS: Final[tuple[int, ...]] = (1, 1, 1, 1, 2, 2, 4, 8)


def generate_claims(
    n: int,
    namespaces: int,
    seed: int,
    slices: list[JSON] | None = None,
    allocated_fraction: float = 0.3,
) -> list[JSON]:
    """`n` ResourceClaims spread over `namespaces` namespaces (`team-000`, ...).

    The mix (by weight): ExactCount by class only (25 %), by productName (20 %), by
    memory capacity (10 %), by cudaComputeCapability version (10 %), MIG by profile
    (12 %), firstAvailable H200-else-H100 (8 %), All on one product (4 %), adminAccess
    (3 %; put in odd-numbered namespaces, which `generate_namespaces` labels for admin
    access, whenever there are at least two namespaces) and consumable-share memory
    requests on L40S via class shared.gpu.nvidia.com (8 %). Counts are 1, 2, 4 or 8
    (MIG at most 2). Claims are named `claim-000000`, ... and carry a uid.

    When `slices` (from `generate_slices`) is given, about `allocated_fraction` of the
    claims carry a `status.allocation` naming real devices that match the claim, on one
    node, never handing the same device out twice (shared L40S devices get a `shareID`
    and `consumedCapacity`; adminAccess results may reuse devices, as the API allows).
    A claim that cannot be placed stays unallocated. Deterministic for a given seed.
    """
    if namespaces < 1:
        raise ValueError("namespaces must be >= 1")
    if n < 0:
        raise ValueError("n must be >= 0")
    with gc_paused():
        return _generate_claims(n, namespaces, seed, slices, allocated_fraction)


def _generate_claims(
    n: int,
    namespaces: int,
    seed: int,
    slices: list[JSON] | None,
    allocated_fraction: float,
) -> list[JSON]:
    rng = random.Random(seed)
    free = _index(slices) if slices else {}
    shared_left: dict[tuple[str, str], int] = {}
    kinds = [k for k, _ in _CLAIM_KINDS]
    weights = [w for _, w in _CLAIM_KINDS]
    claims: list[JSON] = []
    for i in range(n):
        kind = rng.choices(kinds, weights)[0]
        ns_index = rng.randrange(namespaces)
        if kind == "admin" and ns_index % 2 == 0 and namespaces > 1:
            ns_index = ns_index + 1 if ns_index + 1 < namespaces else ns_index - 1
        namespace = f"team-{ns_index:03d}"
        count = _COUNTS[rng.randrange(len(_COUNTS))]
        # want_keys: the device kinds (see _index) that satisfy the request, in the
        # order an allocation tries them.
        request: JSON
        want_keys: tuple[str, ...]
        result_request = "gpu"
        mem_request_mib = 0
        admin = False
        all_mode = False
        if kind == "class":
            request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}
            want_keys = ("h100", "h200", "a100")
        elif kind == "product":
            model_key = rng.choice(("h100", "h100", "h200", "a100"))
            request = {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "gpu.nvidia.com",
                    "allocationMode": "ExactCount",
                    "count": count,
                    "selectors": [_product_selector(GPU_MODELS[model_key].product_name)],
                },
            }
            want_keys = (model_key,)
        elif kind == "memory":
            threshold = rng.choice(("40Gi", "80Gi", "100Gi"))
            request = {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "gpu.nvidia.com",
                    "count": count,
                    "selectors": [
                        _selector(
                            "device.capacity['gpu.nvidia.com'].memory"
                            f".compareTo(quantity('{threshold}')) >= 0"
                        )
                    ],
                },
            }
            want_keys = {"40Gi": ("a100", "h100", "h200"), "80Gi": ("h100", "h200"), "100Gi": ("h200",)}[
                threshold
            ]
        elif kind == "cc":
            request = {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "gpu.nvidia.com",
                    "count": count,
                    "selectors": [
                        _selector(
                            "device.attributes['gpu.nvidia.com'].cudaComputeCapability"
                            ".isGreaterThan(semver('8.0.0'))"
                        )
                    ],
                },
            }
            want_keys = ("h100", "h200")
        elif kind == "mig":
            profile = rng.choice(("1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"))
            count = min(count, 2)
            request = {
                "name": "mig",
                "exactly": {
                    "deviceClassName": "mig.nvidia.com",
                    "count": count,
                    "selectors": [
                        _selector(f"device.attributes['gpu.nvidia.com'].profile == '{profile}'")
                    ],
                },
            }
            result_request = "mig"
            want_keys = (f"mig:{profile}",)
        elif kind == "first":
            request = {
                "name": "gpu",
                "firstAvailable": [
                    {
                        "name": "h200",
                        "deviceClassName": "gpu.nvidia.com",
                        "count": count,
                        "selectors": [_product_selector(GPU_MODELS["h200"].product_name)],
                    },
                    {
                        "name": "h100",
                        "deviceClassName": "gpu.nvidia.com",
                        "count": count,
                        "selectors": [_product_selector(GPU_MODELS["h100"].product_name)],
                    },
                ],
            }
            want_keys = ("h200", "h100")
        elif kind == "all":
            model_key = rng.choice(("h100", "h200", "a100"))
            request = {
                "name": "node",
                "exactly": {
                    "deviceClassName": "gpu.nvidia.com",
                    "allocationMode": "All",
                    "selectors": [_product_selector(GPU_MODELS[model_key].product_name)],
                },
            }
            result_request = "node"
            want_keys = (model_key,)
            all_mode = True
        elif kind == "admin":
            request = {
                "name": "monitor",
                "exactly": {
                    "deviceClassName": "gpu.nvidia.com",
                    "allocationMode": "ExactCount",
                    "count": 1,
                    "adminAccess": True,
                },
            }
            result_request = "monitor"
            want_keys = ("h100", "h200", "a100")
            admin = True
            count = 1
        else:  # shared
            mem_request_mib = rng.choice((1024, 4096, 8192, 10 * 1024, 20 * 1024, 24 * 1024))
            request = {
                "name": "share",
                "exactly": {
                    "deviceClassName": "shared.gpu.nvidia.com",
                    "count": 1,
                    "capacity": {"requests": {"memory": _mib(mem_request_mib)}},
                },
            }
            result_request = "share"
            want_keys = ("l40s",)
            count = 1
        claim_uid = _uuid(rng)
        claim: JSON = {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceClaim",
            "metadata": {"name": f"claim-{i:06d}", "namespace": namespace, "uid": claim_uid},
            "spec": {"devices": {"requests": [request]}},
        }
        if kind != "first":
            want_keys = tuple(rng.sample(want_keys, len(want_keys)))
        if free and rng.random() < allocated_fraction:
            allocation = _allocate(
                rng, free, shared_left, want_keys, count, result_request, request,
                admin=admin, all_mode=all_mode, mem_request_mib=mem_request_mib,
            )
            if allocation is not None:
                claim["status"] = {"allocation": allocation}
        claims.append(claim)
    return claims


def _allocate(
    rng: random.Random,
    free: dict[str, list[_Node]],
    shared_left: dict[tuple[str, str], int],
    want_keys: tuple[str, ...],
    count: int,
    result_request: str,
    request: JSON,
    *,
    admin: bool,
    all_mode: bool,
    mem_request_mib: int,
) -> JSON | None:
    """Pick devices for a claim on one node (removing them from `free`), or None."""
    for key_index, key in enumerate(want_keys):
        nodes = free.get(key, [])
        if not nodes:
            continue
        # Try a few random nodes of that kind; good enough to place most claims.
        for _ in range(4):
            node_i = rng.randrange(len(nodes))
            devs = nodes[node_i].devices
            if all_mode:
                # All needs every matching device of the node to be free: only nodes
                # nobody allocated from yet qualify.
                if nodes[node_i].touched:
                    continue
                picked = list(devs)
                devs.clear()
            elif key == "l40s":
                picked = []
                for d in devs:
                    left = shared_left.get((d.pool, d.name), d.memory_mib)
                    if left >= mem_request_mib:
                        shared_left[(d.pool, d.name)] = left - mem_request_mib
                        picked = [d]
                        break
                if not picked:
                    continue
            elif len(devs) >= count:
                picked = devs[:count] if admin else [devs.pop() for _ in range(count)]
            else:
                continue
            if not admin:
                nodes[node_i].touched = True
            if not devs:
                nodes.pop(node_i)
            sub = ""
            if "firstAvailable" in request:
                sub = "/" + request["firstAvailable"][key_index]["name"]
            results: list[JSON] = []
            for d in picked:
                r: JSON = {
                    "request": result_request + sub,
                    "driver": NVIDIA_DRIVER,
                    "pool": d.pool,
                    "device": d.name,
                }
                if admin:
                    r["adminAccess"] = True
                if key == "l40s":
                    r["shareID"] = _uuid(rng)
                    r["consumedCapacity"] = {"memory": _mib(mem_request_mib)}
                results.append(r)
            node = picked[0].pool
            return {
                "devices": {"results": results},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            }
    return None


def generate_namespaces(namespaces: int) -> list[JSON]:
    """Namespace objects for `generate_claims`; odd-numbered ones allow adminAccess."""
    out: list[JSON] = []
    for k in range(namespaces):
        meta: JSON = {"name": f"team-{k:03d}"}
        if k % 2 == 1:
            meta["labels"] = {ADMIN_ACCESS_LABEL: "true"}
        out.append({"apiVersion": "v1", "kind": "Namespace", "metadata": meta})
    return out
