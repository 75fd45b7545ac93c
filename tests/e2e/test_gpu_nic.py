"""A GPU and its RDMA NIC, and an accelerator that publishes no memory, under a memory quota.

On the real control plane with `dra-quota serve` (its shipped memory sources): one fake
node with two GPUs on two PCIe roots (80Gi on pci0000:17, 40Gi on pci0000:29), a dranet
RDMA NIC on pci0000:29 only (driver dra.net, no capacity) and a Gaudi3 (driver
gaudi.intel.com, no capacity: the shipped memory source prices it at 128Gi). The
namespace's DeviceQuota has no scope. A Pod's claim for a GPU and a NIC on one PCIe root
(`matchAttribute: resource.kubernetes.io/pcieRoot`) is admitted (the NIC has no memory:
outside the quota; before, no price was no admission), the real scheduler puts it on the
40Gi GPU beside the NIC, and the quota counts exactly that GPU: 40Gi, 1 device. A Pod's
Gaudi claim is then counted at 128Gi from the memory source.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from .cluster import ControlPlane
from .driver import (
    GAUDI_DRIVER, NIC_DRIVER, PCIE_ROOT, RESOURCE_V1, Gpu, GpuFleet, allocation_results, claim_spec,
    create_claim_template, create_device_class, create_pod, exact_request, gaudi_devices, rdma_nics,
    wait_pod_allocated,
)
from .harness import DQ, RUN_LABEL, MakeFleet, MakeNamespace, Served, adapted_webhooks, governed, installed
from .kube import Kube, Obj, poll

pytestmark = pytest.mark.e2e


@dataclass
class Rdma:
    namespace: str
    served: Served
    fleet: GpuFleet
    nic_class: str
    gaudi_class: str


@pytest_asyncio.fixture(loop_scope="session")
async def rdma(cluster: ControlPlane, kube: Kube, served: Served, make_namespace: MakeNamespace,
               make_fleet: MakeFleet) -> AsyncIterator[Rdma]:
    run = uuid.uuid4().hex[:8]
    fleet = await make_fleet("nic")
    node = await fleet.add_node("n1", [Gpu("NVIDIA H100 80GB HBM3", "80Gi", "pci0000:17"),
                                       Gpu("NVIDIA A100-PCIE-40GB", "40Gi", "pci0000:29")])
    await fleet.add_driver(node, NIC_DRIVER, rdma_nics(["pci0000:29"]))
    await fleet.add_driver(node, GAUDI_DRIVER, gaudi_devices(["Gaudi3"]))
    nic_class, gaudi_class = f"rdma-{run}", f"gaudi-{run}"
    for name, expression in ((nic_class, f'device.driver == "{NIC_DRIVER}" && '
                                         f'device.attributes["{NIC_DRIVER}"].rdma == true'),
                             (gaudi_class, f'device.driver == "{GAUDI_DRIVER}"')):
        await kube.create(RESOURCE_V1, "deviceclasses", {"kind": "DeviceClass", "metadata": {"name": name},
                                                         "spec": {"selectors": [{"cel": {"expression": expression}}]}})
    namespace = await make_namespace("nic", labels={RUN_LABEL: run})
    try:
        async with installed(kube, adapted_webhooks(run, served.port, cluster)):
            yield Rdma(namespace, served, fleet, nic_class, gaudi_class)
    finally:
        for name in (nic_class, gaudi_class):
            await kube.delete(RESOURCE_V1, "deviceclasses", name)


async def used(kube: Kube, namespace: str, memory: str, devices: int, allocated: int) -> Obj:
    async def counted() -> Obj | None:
        status: Obj = (await kube.get(DQ, "devicequotas", "accelerators", namespace=namespace)).get("status") or {}
        want = ({"memory": memory, "devices": devices}, {"allocated": allocated, "pending": 0})
        return status if (status.get("used"), status.get("claims")) == want else None

    status: Obj = await poll(counted, timeout=60, what=f"the quota to count {memory} and {devices} device(s)")
    return status


async def test_a_gpu_and_its_nic_are_admitted_allocated_on_one_root_and_counted_as_the_gpu(
        kube: Kube, rdma: Rdma) -> None:
    setup = rdma
    with setup.served.log_on_failure():
        await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "accelerators"},
                                                "spec": {"hard": {"memory": "200Gi", "devices": 2}}},
                          namespace=setup.namespace)
        await governed(kube, setup.namespace)
        spec = claim_spec(exact_request("gpu", setup.fleet.device_class), exact_request("nic", setup.nic_class))
        spec["devices"]["constraints"] = [{"requests": ["gpu", "nic"], "matchAttribute": PCIE_ROOT}]
        await create_claim_template(kube, setup.namespace, "gpu-nic", spec)
        await create_pod(kube, setup.namespace, "trainer", template="gpu-nic", node_selector=setup.fleet.node_selector)
        _, claim = await wait_pod_allocated(kube, setup.namespace, "trainer", timeout=120)
        # The scheduler honoured the constraint: the NIC's root holds only the 40Gi GPU.
        results = {r["request"]: (r["driver"], r["device"]) for r in allocation_results(claim)}
        assert results == {"gpu": ("gpu.nvidia.com", "gpu-1"), "nic": (NIC_DRIVER, "pci-0000-1a-00-1")}, results
        # Admitted at the GPU alone (the larger GPU: Conservative), counted exactly once allocated.
        assert '"devices":1' in claim["metadata"]["annotations"]["draquota.io/charge"].replace(" ", "")
        status = await used(kube, setup.namespace, "40Gi", 1, 1)
        assert status["reserved"] == {"memory": "0", "devices": 0}

        gaudi = claim_spec(exact_request("gaudi", setup.gaudi_class))
        await create_claim_template(kube, setup.namespace, "gaudi", gaudi)
        await create_pod(kube, setup.namespace, "gaudi", template="gaudi", node_selector=setup.fleet.node_selector)
        _, claim = await wait_pod_allocated(kube, setup.namespace, "gaudi", timeout=120)
        assert [r["driver"] for r in allocation_results(claim)] == [GAUDI_DRIVER]
        # 128Gi from the shipped memory source for a Gaudi3: 40Gi + 128Gi.
        await used(kube, setup.namespace, "168Gi", 2, 2)
