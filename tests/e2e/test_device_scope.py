"""A DeviceQuota scoped by what the devices are holds whichever class a claim names.

Asking for the same device through another class is no way around it. On the real control
plane with `dra-quota serve`: two GPUs of a model unique to this run ("H100", 80Gi) and two
of another ("L4", 24Gi) on one fake node; two DeviceClasses that
both select the H100s, `h100` by model and `gpus` by driver and either model. A quota
scoped `deviceClassNames: [h100]` would never see a claim through `gpus` (the sidestep
docs/charging.md documents); this one is scoped `spec.devices` (the driver and a CEL selector
on the model) and holds two H100s' memory. Claims for an H100 through either class are
admitted until the quota is full, the next one (direct, or stamped from a Pod's template
through `gpus`) is refused with the quota's numbers, a claim for an L4 through `gpus` is
not the quota's business and is admitted; then the real scheduler allocates the admitted
claims and the quota's status counts exactly the H100s, within `hard`. The API server
keeps `spec.devices` (a CRD without it would prune it, and the quota would count the L4
claim too).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from .cluster import ControlPlane
from .driver import (
    DRIVER, RESOURCE_V1, Gpu, allocation_results, claim_spec, create_claim_template, create_device_class, create_pod,
    exact_request,
)
from .harness import (
    DQ, QUOTA_HOOK, RUN_LABEL, MakeFleet, MakeNamespace, Served, adapted_webhooks, advised, denial, governed,
    installed,
)
from .kube import Kube, Obj, poll

pytestmark = pytest.mark.e2e

RUN = uuid.uuid4().hex[:8]
H100, L4 = f"NVIDIA H100 80GB e2e-{RUN}", f"NVIDIA L4 e2e-{RUN}"


def model(product: str) -> str:
    return f'device.attributes["{DRIVER}"].productName == "{product}"'


@dataclass
class Scoped:
    namespace: str
    served: Served
    node_selector: dict[str, str]
    by_model: str  # the class naming the H100s
    by_driver: str  # another class selecting the same H100s (and the L4s)


@pytest_asyncio.fixture(loop_scope="session")
async def scoped(cluster: ControlPlane, kube: Kube, served: Served, make_namespace: MakeNamespace,
                 make_fleet: MakeFleet) -> AsyncIterator[Scoped]:
    run = uuid.uuid4().hex[:8]
    fleet = await make_fleet("scope")
    await fleet.add_node("n1", [Gpu(H100, "80Gi")] * 2 + [Gpu(L4, "24Gi")] * 2)
    by_model, by_driver = f"h100-{run}", f"gpus-{run}"
    await create_device_class(kube, by_model, extra_cel=model(H100))
    await create_device_class(kube, by_driver, extra_cel=f"{model(H100)} || {model(L4)}")
    namespace = await make_namespace("scope", labels={RUN_LABEL: run})
    try:
        async with installed(kube, adapted_webhooks(run, served.port, cluster)):
            yield Scoped(namespace, served, fleet.node_selector, by_model, by_driver)
    finally:
        for name in (by_model, by_driver):
            await kube.delete(RESOURCE_V1, "deviceclasses", name)


async def claim(kube: Kube, setup: Scoped, name: str, device_class: str, product: str, *, count: int = 1,
                dry_run: bool = False) -> Obj:
    body = {"kind": "ResourceClaim", "metadata": {"name": name},
            "spec": claim_spec(exact_request("gpu", device_class, count=count, selectors=[model(product)]))}
    return await kube.create(RESOURCE_V1, "resourceclaims", body, namespace=setup.namespace, dry_run=dry_run)


async def quota_status(kube: Kube, setup: Scoped) -> Obj:
    status: Obj = (await kube.get(DQ, "devicequotas", "h100s", namespace=setup.namespace)).get("status") or {}
    return status


async def test_a_device_scope_holds_claims_through_either_class(kube: Kube, scoped: Scoped) -> None:
    setup = scoped
    with setup.served.log_on_failure():
        await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "h100s"}, "spec": {
            "hard": {"memory": "160Gi", "devices": 2},
            "devices": {"drivers": [DRIVER], "selectors": [{"cel": {"expression": model(H100)}}]}}},
            namespace=setup.namespace)
        stored = await kube.get(DQ, "devicequotas", "h100s", namespace=setup.namespace)
        assert stored["spec"]["devices"]["selectors"] == [{"cel": {"expression": model(H100)}}]  # not pruned
        await governed(kube, setup.namespace)

        async def enforced() -> bool:
            # Three H100s through the other class never fit two.
            message = await denial(claim(kube, setup, "probe", setup.by_driver, H100, count=3, dry_run=True))
            return 'exceeded DeviceQuota "h100s"' in message

        await poll(enforced, timeout=30, what="the webhook to enforce the DeviceQuota")

        await claim(kube, setup, "by-model", setup.by_model, H100)
        await claim(kube, setup, "by-driver", setup.by_driver, H100)
        # Through the class the quota does not name: refused all the same (the sidestep).
        message = await denial(claim(kube, setup, "sidestep", setup.by_driver, H100))
        assert message == advised(f'admission webhook "{QUOTA_HOOK}" denied the request: exceeded DeviceQuota '
                                  '"h100s": requested devices=1,memory=80Gi, used devices=0,memory=0, reserved '
                                  "devices=2,memory=160Gi, limited devices=2,memory=160Gi", "reserved",
                                  namespace=setup.namespace), message
        # An L4 is not what the quota holds.
        await claim(kube, setup, "l4", setup.by_driver, L4)

        # A Pod's claim stamped from a template through the other class is refused too.
        spec = claim_spec(exact_request("gpu", setup.by_driver, selectors=[model(H100)]))
        await create_claim_template(kube, setup.namespace, "h100-via-gpus", spec)
        await create_pod(kube, setup.namespace, "stamped", template="h100-via-gpus", node_selector=setup.node_selector)

        async def refused() -> str | None:
            events = await kube.list("v1", "events", namespace=setup.namespace,
                                     field_selector="involvedObject.name=stamped,reason=FailedResourceClaimCreation")
            return next((e["message"] for e in events if 'exceeded DeviceQuota "h100s"' in e["message"]), None)

        assert re.search(r"requested devices=1,memory=80Gi, .* limited devices=2,memory=160Gi",
                         await poll(refused, timeout=60, what="the stamped claim refused"))
        await kube.delete("v1", "pods", "stamped", namespace=setup.namespace, grace_period_seconds=0)

        # The scheduler allocates what was admitted; the quota counts the H100s, within hard.
        devices: dict[str, list[str]] = {}
        for name in ("by-model", "by-driver", "l4"):
            await create_pod(kube, setup.namespace, f"pod-{name}", claim=name, node_selector=setup.node_selector)
            allocated = await kube.wait_for(RESOURCE_V1, "resourceclaims", name,
                                            lambda c: bool((c.get("status") or {}).get("allocation")),
                                            namespace=setup.namespace, timeout=120, what="allocated")
            devices[name] = [r["device"] for r in allocation_results(allocated)]
        assert len({d for name in ("by-model", "by-driver") for d in devices[name]}) == 2
        assert set(devices["by-model"] + devices["by-driver"]) == {"gpu-0", "gpu-1"}  # the H100s
        assert devices["l4"][0] in ("gpu-2", "gpu-3")

        async def counted() -> Obj | None:
            status = await quota_status(kube, setup)
            used, claims = status.get("used") or {}, status.get("claims") or {}
            done = used.get("memory") == "160Gi" and claims.get("pending") == 0
            return status if done else None

        status = await poll(counted, timeout=60, what="the quota's status to count the allocations")
        assert status["used"] == {"memory": "160Gi", "devices": 2}
        assert status["reserved"] == {"memory": "0", "devices": 0}
        assert status["claims"] == {"allocated": 2, "pending": 0}  # not the L4 claim
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        exceeded = next(c for c in status["conditions"] if c["type"] == "Exceeded")
        assert (ready["status"], exceeded["status"]) == ("True", "False")
