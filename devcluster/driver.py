"""Fake GPU nodes and a fake DRA driver for the end-to-end tests and `dra-quota demo`.

There are no kubelets and no real driver: the tests create Node objects with
allocatable cpu/memory/pods, and publish DeviceClasses and resource.k8s.io/v1
ResourceSlices the way a DRA kubelet plugin would (one pool per node, named after
the node; k8s.io/dynamic-resource-allocation/resourceslice/resourceslicecontroller.go).
The real kube-scheduler then allocates claims against those slices, and the
real resourceclaim controller creates claims from templates. Pods never run:
they stay bound-but-Pending, which is all allocation and quota need.

Isolation: every :class:`GpuFleet` labels its nodes with a unique
``minik8s.test/fleet`` value and its pods select that label, so concurrent tests
never schedule onto each other's nodes or devices; its DeviceClass has a unique
name too, so per-class ResourceQuotas of one test do not see another test's claims.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from devcluster.kube import Kube
from quota.values.raw import Obj

DRIVER = "gpu.nvidia.com"
NIC_DRIVER = "dra.net"
GAUDI_DRIVER = "gaudi.intel.com"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
RESOURCE_V1 = "resource.k8s.io/v1"
FLEET_LABEL = "minik8s.test/fleet"
POD_IMAGE = "registry.k8s.io/pause:3.10"  # never pulled: there is no kubelet


@dataclass(frozen=True)
class Gpu:
    """One device as the driver publishes it."""

    product: str = "NVIDIA A100-SXM4-80GB"
    memory: str = "80Gi"
    # The standard resource.kubernetes.io/pcieRoot attribute (a GPU + NIC claim's
    # matchAttribute); None: not published, as before.
    pcie_root: str | None = None


@dataclass
class GpuFleet:
    """Nodes + one DeviceClass + ResourceSlices belonging to one test; :meth:`delete` removes them all."""

    kube: Kube
    prefix: str
    device_class: str
    driver: str = DRIVER
    nodes: list[str] = field(default_factory=list)
    slices: list[str] = field(default_factory=list)

    @property
    def node_selector(self) -> dict[str, str]:
        """Pod nodeSelector that keeps a pod on this fleet's nodes."""
        return {FLEET_LABEL: self.prefix}

    async def add_node(self, suffix: str, gpus: Sequence[Gpu], *, cpu: str = "64", memory: str = "512Gi") -> str:
        """Create a Node and publish its GPUs as pool ``<node>`` in one ResourceSlice; returns the node name."""
        name = f"{self.prefix}-{suffix}"
        await create_node(self.kube, name, cpu=cpu, memory=memory, labels={FLEET_LABEL: self.prefix})
        self.nodes.append(name)
        slice_obj = await publish_node_slice(self.kube, name, gpu_devices(name, gpus), driver=self.driver)
        self.slices.append(slice_obj["metadata"]["name"])
        return name

    async def add_driver(self, node: str, driver: str, devices: list[Obj]) -> None:
        """Publish another driver's devices on this fleet's `node` (its own pool, named
        after the node, as every kubelet plugin does); deleted with the fleet."""
        slice_obj = await publish_node_slice(self.kube, node, devices, driver=driver)
        self.slices.append(slice_obj["metadata"]["name"])

    async def delete(self) -> None:
        for s in self.slices:
            await self.kube.delete(RESOURCE_V1, "resourceslices", s)
        for n in self.nodes:
            await self.kube.delete("v1", "nodes", n)
        await self.kube.delete(RESOURCE_V1, "deviceclasses", self.device_class)


async def create_fleet(kube: Kube, prefix: str, *, driver: str = DRIVER) -> GpuFleet:
    """A fleet with its own DeviceClass ``<prefix>-gpu`` selecting this driver's devices of type "gpu"."""
    cls = f"{prefix}-gpu"
    await create_device_class(kube, cls, driver=driver)
    return GpuFleet(kube=kube, prefix=prefix, device_class=cls, driver=driver)


async def create_node(
    kube: Kube,
    name: str,
    *,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: str = "110",
    labels: dict[str, str] | None = None,
) -> Obj:
    """A Node object without a kubelet: schedulable, untainted, Ready, with allocatable cpu/memory/pods.

    Status is written through the status subresource as a kubelet would. Nothing ever
    heartbeats the node; the node-lifecycle controller is off (see cluster.py), so it is
    never tainted unreachable either.
    """
    resources = {"cpu": cpu, "memory": memory, "pods": pods}
    await kube.create(
        "v1",
        "nodes",
        {
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})},
            },
        },
    )
    await kube.patch(
        "v1",
        "nodes",
        name,
        {
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "fake node (minik8s e2e)",
                    }
                ],
            }
        },
        subresource="status",
    )
    # The TaintNodesByCondition admission plugin taints every new Node
    # node.kubernetes.io/not-ready:NoSchedule (plugin/pkg/admission/nodetaint);
    # the node-lifecycle controller lifts it once the kubelet reports Ready.
    # That controller is off here (it would evict everything from nodes that
    # never heartbeat), so do its job for this Ready node.
    return await kube.patch("v1", "nodes", name, {"spec": {"taints": None}})


def gpu_devices(node: str, gpus: Iterable[Gpu]) -> list[Obj]:
    """Devices ``gpu-0..`` with attributes type/productName/uuid and capacity memory (unqualified
    names belong to the driver's domain: ``device.attributes["gpu.nvidia.com"].productName``),
    and pcieRoot where the GPU names one."""
    gpus = list(gpus)
    devices: list[Obj] = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "productName": {"string": g.product},
                # Stable per node+index, like a real GPU UUID is per board.
                "uuid": {"string": f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'minik8s/{node}/{i}')}"},
            },
            "capacity": {"memory": {"value": g.memory}},
        }
        for i, g in enumerate(gpus)
    ]
    if any(g.pcie_root for g in gpus):
        for device, g in zip(devices, gpus, strict=True):
            if g.pcie_root:
                device["attributes"][PCIE_ROOT] = {"string": g.pcie_root}
    return devices


def rdma_nics(pcie_roots: Iterable[str]) -> list[Obj]:
    """RDMA NICs as kubernetes-sigs/dranet publishes them (driver ``dra.net``): fully
    qualified ``dra.net/...`` attributes and the standard pcieRoot, no capacity at all."""
    return [
        {
            "name": f"pci-0000-{i + 0x1a:02x}-00-1",
            "attributes": {
                f"{NIC_DRIVER}/rdma": {"bool": True},
                f"{NIC_DRIVER}/pciDevice": {"string": "MT2910 Family [ConnectX-7]"},
                f"{NIC_DRIVER}/rdmaDevice": {"string": f"mlx5_{i}"},
                f"{NIC_DRIVER}/numaNode": {"int": 0},
                PCIE_ROOT: {"string": root},
            },
        }
        for i, root in enumerate(pcie_roots)
    ]


def gaudi_devices(models: Iterable[str]) -> list[Obj]:
    """Gaudi accelerators as intel's driver publishes them (driver ``gaudi.intel.com``):
    attributes model, serial, healthy, no capacity; their memory comes from dra-quota's
    memory sources (the shipped ones price a Gaudi3 at 128Gi)."""
    return [
        {
            "name": f"0000-{i + 0x33:02x}-00-0-0x1060",
            "attributes": {"model": {"string": model}, "serial": {"string": f"AM4{i:02d}012345"},
                           "healthy": {"bool": True}},
        }
        for i, model in enumerate(models)
    ]


async def publish_node_slice(
    kube: Kube,
    node: str,
    devices: list[Obj],
    *,
    driver: str = DRIVER,
    pool: str | None = None,
    generation: int = 1,
) -> Obj:
    """Publish one ResourceSlice holding the whole pool ``pool`` (default: the node name) of ``node``."""
    pool = pool or node
    return await kube.create(
        RESOURCE_V1,
        "resourceslices",
        {
            "kind": "ResourceSlice",
            # kubelet plugins use generateName "<node>-<driver>-"; a fixed name
            # keeps clean-up simple and is equally valid.
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {
                "driver": driver,
                "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
                "nodeName": node,
                "devices": devices,
            },
        },
    )


async def create_device_class(kube: Kube, name: str, *, driver: str = DRIVER, extra_cel: str | None = None) -> Obj:
    expr = f'device.driver == "{driver}" && device.attributes["{driver}"].type == "gpu"'
    if extra_cel:
        expr = f"({expr}) && ({extra_cel})"
    return await kube.create(
        RESOURCE_V1,
        "deviceclasses",
        {"kind": "DeviceClass", "metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expr}}]}},
    )


def exact_request(
    name: str,
    device_class: str,
    *,
    count: int | None = None,
    selectors: Sequence[str] = (),
    admin_access: bool | None = None,
    allocation_mode: str | None = None,
) -> Obj:
    """One ``spec.devices.requests[]`` entry of the ``exactly`` form."""
    exactly: Obj = {"deviceClassName": device_class}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if count is not None:
        exactly["count"] = count
    if admin_access is not None:
        exactly["adminAccess"] = admin_access
    if allocation_mode is not None:
        exactly["allocationMode"] = allocation_mode
    return {"name": name, "exactly": exactly}


def claim_spec(*requests: Obj) -> Obj:
    return {"devices": {"requests": list(requests)}}


async def create_claim(kube: Kube, namespace: str, name: str, spec: Obj) -> Obj:
    return await kube.create(
        RESOURCE_V1,
        "resourceclaims",
        {"kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec},
        namespace=namespace,
    )


async def create_claim_template(kube: Kube, namespace: str, name: str, spec: Obj) -> Obj:
    return await kube.create(
        RESOURCE_V1,
        "resourceclaimtemplates",
        {"kind": "ResourceClaimTemplate", "metadata": {"name": name}, "spec": {"spec": spec}},
        namespace=namespace,
    )


async def create_pod(
    kube: Kube,
    namespace: str,
    name: str,
    *,
    template: str | None = None,
    claim: str | None = None,
    node_selector: dict[str, str] | None = None,
) -> Obj:
    """A pod with one pod-level claim ``gpu`` (from ``template`` or the existing ``claim``) used by its container."""
    return await kube.create("v1", "pods", pod_body(name, template=template, claim=claim, node_selector=node_selector),
                             namespace=namespace)


def pod_body(
    name: str,
    *,
    template: str | None = None,
    claim: str | None = None,
    node_selector: dict[str, str] | None = None,
) -> Obj:
    """The Pod :func:`create_pod` creates (for a caller that creates it as another user)."""
    if (template is None) == (claim is None):
        raise ValueError("pass exactly one of template= or claim=")
    ref: Obj = {"name": "gpu"}
    if template is not None:
        ref["resourceClaimTemplateName"] = template
    else:
        ref["resourceClaimName"] = claim
    spec: Obj = {
        "resourceClaims": [ref],
        "containers": [{"name": "main", "image": POD_IMAGE, "resources": {"claims": [{"name": "gpu"}]}}],
        "terminationGracePeriodSeconds": 0,
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"kind": "Pod", "metadata": {"name": name}, "spec": spec}


def generated_claim_name(pod: Obj, pod_claim: str = "gpu") -> str | None:
    """The ResourceClaim the resourceclaim controller created for ``pod_claim`` (pod.status.resourceClaimStatuses)."""
    for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if s.get("name") == pod_claim:
            name: str | None = s.get("resourceClaimName")
            return name
    return None


async def wait_pod_allocated(
    kube: Kube, namespace: str, pod_name: str, *, pod_claim: str = "gpu", timeout: float = 60.0
) -> tuple[Obj, Obj]:
    """Wait until the real scheduler allocated the pod's claim and bound the pod; returns (pod, claim).

    Order of events upstream: resourceclaim controller creates the claim and records it in
    pod.status.resourceClaimStatuses; the scheduler's DynamicResources plugin allocates
    (claim status.allocation + reservedFor) in PreBind, then binds (pod.spec.nodeName).
    """
    pod = await kube.wait_for(
        "v1",
        "pods",
        pod_name,
        lambda p: bool(p["spec"].get("nodeName")) and generated_claim_name(p, pod_claim) is not None,
        namespace=namespace,
        timeout=timeout,
        what="bound to a node with its claim created",
    )
    claim_name = generated_claim_name(pod, pod_claim)
    assert claim_name is not None
    claim = await kube.wait_for(
        RESOURCE_V1,
        "resourceclaims",
        claim_name,
        lambda c: bool((c.get("status") or {}).get("allocation")),
        namespace=namespace,
        timeout=timeout,
        what="allocated",
    )
    return pod, claim


async def free_pod(kube: Kube, namespace: str, pod_name: str, *, timeout: float = 60.0) -> None:
    """Delete a pod with grace period 0 (no kubelet would ever confirm a graceful stop) and
    wait until its template-generated claims are gone, i.e. the devices are free again."""
    pod = await kube.get_or_none("v1", "pods", pod_name, namespace=namespace)
    if pod is None:
        return
    claims = [
        s["resourceClaimName"]
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if s.get("resourceClaimName")
    ]
    await kube.delete("v1", "pods", pod_name, namespace=namespace, grace_period_seconds=0)
    await kube.wait_deleted("v1", "pods", pod_name, namespace=namespace, timeout=timeout)
    for c in claims:
        # The resourceclaim controller drops the reservation and deletes the generated
        # claim (owned by the pod), releasing its delete-protection finalizer.
        await kube.wait_deleted(RESOURCE_V1, "resourceclaims", c, namespace=namespace, timeout=timeout)


def allocation_results(claim: Obj) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return results
